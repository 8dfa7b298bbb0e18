package api

import (
	"net/http"
	"strconv"

	apispec "github.com/tally-billing/tally/apispec"
)

// handleOpenAPIDocument answers the API's OpenAPI 3.1 document
// (apispec/openapi.yaml, built into the binary), open like /healthz.
func handleOpenAPIDocument() http.Handler {
	doc := apispec.Document()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Header().Set("Content-Length", strconv.Itoa(len(doc)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(doc)
	})
}
