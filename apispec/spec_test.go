package apispec_test

import (
	"fmt"
	"testing"

	"github.com/oapi-codegen/oapi-codegen/v2/pkg/util"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
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

	// ValidKinOpenAPI: the document as oapi-codegen loads it (with its
	// kin-openapi loader, as TestClient does) passes kin-openapi's checks as
	// well, which look into schema objects (types, nullable types, formats),
	// where the OpenAPI 3.1 meta-schema above leaves them open.
	t.Run("ValidKinOpenAPI", func(t *testing.T) {
		t.Parallel()
		spec, err := util.LoadSwagger("openapi.yaml")
		require.NoError(t, err)
		require.NoError(t, spec.Validate(t.Context()))
	})
}
