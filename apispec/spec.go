// Package apispec holds Tally's HTTP API contract, the OpenAPI 3.1 document
// openapi.yaml, built into the binary so the server answers it at
// GET /openapi.yaml and tests hold the API to it (internal/api's tests
// validate every response they get against it). It holds no code that
// serves or checks anything; apispectest does the checking.
package apispec

import _ "embed"

// document is openapi.yaml as it was at build time.
//
//go:embed openapi.yaml
var document []byte

// Document returns the OpenAPI document (YAML). The slice is shared: callers
// must not modify it.
func Document() []byte { return document }
