package apispec_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	"github.com/pb33f/libopenapi-validator/helpers"
	"github.com/stretchr/testify/require"

	apispec "github.com/tally-billing/tally/apispec"
	"github.com/tally-billing/tally/apispec/apispectest"
)

func TestDocument(t *testing.T) {
	t.Parallel()

	// Valid: the document passes libopenapi-validator's check against the
	// OpenAPI 3.1 schema, and builds a model without errors (every $ref
	// resolves).
	t.Run("Valid", func(t *testing.T) {
		t.Parallel()
		doc, err := libopenapi.NewDocument(apispec.Document())
		require.NoError(t, err)
		require.Equal(t, "3.1.0", doc.GetVersion())
		v, errs := validator.NewValidator(doc)
		require.Empty(t, errs)
		ok, verrs := v.ValidateDocument()
		var msgs []string
		for _, e := range verrs {
			msgs = append(msgs, e.Error())
			for _, f := range e.SchemaValidationErrors {
				msgs = append(msgs, fmt.Sprintf("  %s: %s", f.FieldPath, f.Reason))
			}
		}
		require.True(t, ok, "apispec/openapi.yaml is not a valid OpenAPI 3.1 document:\n%v", msgs)
		_, err = apispectest.Load()
		require.NoError(t, err)
	})

	// Schemas: the document's schema objects, which the OpenAPI 3.1 schema
	// above leaves open, are valid JSON Schema 2020-12, OpenAPI 3.1's
	// dialect (types, nullable types such as [string, "null"], formats,
	// patterns), and compile as libopenapi-validator compiles them; none is
	// both readOnly and writeOnly; and every default and example takes its
	// schema (a schema's default, examples and example; a parameter's,
	// header's or media type's example and examples).
	t.Run("Schemas", func(t *testing.T) {
		t.Parallel()
		doc, err := libopenapi.NewDocument(apispec.Document())
		require.NoError(t, err)
		specJSON := doc.GetSpecInfo().GetSpecJSONBytes()
		require.NotNil(t, specJSON)
		dec := json.NewDecoder(bytes.NewReader(*specJSON))
		dec.UseNumber() // numbers as the JSON Schema compiler reads them
		var spec any
		require.NoError(t, dec.Decode(&spec))

		const url = "openapi.json"
		c := helpers.NewCompilerWithOptions(config.NewValidationOptions(config.WithFormatAssertions()))
		require.NoError(t, c.AddResource(url, spec))
		problems := map[string]bool{} // a schema's error once, not once per $ref to it
		sites := schemaSites(spec)
		require.NotEmpty(t, sites)
		for _, s := range sites {
			schema, err := c.Compile(url + "#" + s.schema)
			if err != nil {
				problems[err.Error()] = true // names the schema at fault
				continue
			}
			for ptr, v := range s.examples() {
				if err := schema.Validate(v); err != nil {
					problems[fmt.Sprintf("%s does not take its schema: %v", ptr, err)] = true
				}
			}
			if s.ptr == s.schema && s.obj["readOnly"] == true && s.obj["writeOnly"] == true {
				problems[s.ptr+": both readOnly and writeOnly"] = true
			}
		}
		require.Empty(t, slices.Sorted(maps.Keys(problems)), "apispec/openapi.yaml's schemas")
	})
}

// schemaSite is where an OpenAPI document holds a schema object: the schema
// itself, or a parameter, header or media type that holds one.
type schemaSite struct {
	ptr    string         // the JSON pointer of obj
	obj    map[string]any // the object at ptr
	schema string         // the JSON pointer of the schema: ptr, or ptr+"/schema"
}

// examples returns the values at s that must take its schema, by their JSON
// pointers: a schema's default, examples and example; a parameter's,
// header's or media type's example and the value of each of its examples.
func (s schemaSite) examples() map[string]any {
	values := map[string]any{}
	if v, ok := s.obj["example"]; ok {
		values[s.ptr+"/example"] = v
	}
	if s.ptr == s.schema {
		if v, ok := s.obj["default"]; ok {
			values[s.ptr+"/default"] = v
		}
		examples, _ := s.obj["examples"].([]any)
		for i, v := range examples {
			values[fmt.Sprintf("%s/examples/%d", s.ptr, i)] = v
		}
		return values
	}
	examples, _ := s.obj["examples"].(map[string]any)
	for name, e := range examples {
		if e, ok := e.(map[string]any); ok {
			if v, ok := e["value"]; ok {
				values[s.ptr+"/examples/"+pointerToken(name)+"/value"] = v
			}
		}
	}
	return values
}

// The JSON Schema 2020-12 keywords whose value is a schema, an array of
// schemas, or an object of them.
var (
	schemaKeywords      = []string{"items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contentSchema"}
	schemaArrayKeywords = []string{"allOf", "anyOf", "oneOf", "prefixItems"}
	schemaMapKeywords   = []string{"properties", "patternProperties", "$defs", "dependentSchemas"}
)

// schemaSites returns every schema object of spec, an OpenAPI 3.1 document
// decoded from JSON, nested ones included (each where it is written: a $ref
// is not followed), and every object that holds one under "schema".
// Examples and extensions (x-…) are data, not document: not searched.
func schemaSites(spec any) []schemaSite {
	var sites []schemaSite
	var inSchema func(v any, ptr string)
	inSchema = func(v any, ptr string) {
		obj, ok := v.(map[string]any)
		if !ok {
			return // true or false
		}
		sites = append(sites, schemaSite{ptr: ptr, obj: obj, schema: ptr})
		for _, k := range schemaKeywords {
			if sub, ok := obj[k]; ok {
				inSchema(sub, ptr+"/"+pointerToken(k))
			}
		}
		for _, k := range schemaArrayKeywords {
			subs, _ := obj[k].([]any)
			for i, sub := range subs {
				inSchema(sub, fmt.Sprintf("%s/%s/%d", ptr, k, i))
			}
		}
		for _, k := range schemaMapKeywords {
			subs, _ := obj[k].(map[string]any)
			for name, sub := range subs {
				inSchema(sub, ptr+"/"+pointerToken(k)+"/"+pointerToken(name))
			}
		}
	}
	var inDocument func(v any, ptr string)
	inDocument = func(v any, ptr string) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				p := ptr + "/" + pointerToken(k)
				switch {
				case k == "schema":
					sites = append(sites, schemaSite{ptr: ptr, obj: v, schema: p})
					inSchema(e, p)
				case ptr == "/components" && k == "schemas":
					schemas, _ := e.(map[string]any)
					for name, s := range schemas {
						inSchema(s, p+"/"+pointerToken(name))
					}
				case k == "example", k == "examples", strings.HasPrefix(k, "x-"):
				default:
					inDocument(e, p)
				}
			}
		case []any:
			for i, e := range v {
				inDocument(e, fmt.Sprintf("%s/%d", ptr, i))
			}
		}
	}
	inDocument(spec, "")
	return sites
}

// pointerToken escapes s as a token of a JSON pointer (RFC 6901).
func pointerToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
