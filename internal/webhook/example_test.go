package webhook_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/tally-billing/tally/internal/webhook"
)

// A receiver of Tally's webhooks: it verifies the signature of the raw body
// before anything else, and answers 400 when it does not verify, so Tally
// records the reason in the delivery's attempt log.
func Example() {
	secret := "whsec_test" // the endpoint's secret, from the receiver's config

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err == nil {
			err = webhook.Verify(body, r.Header.Get(webhook.SignatureHeader), secret, webhook.DefaultTolerance, time.Now())
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// Handle the notification in body; skip it if its id was seen before.
		w.WriteHeader(http.StatusOK)
	})

	// Three requests: signed by Tally, signed with another secret, unsigned.
	body := []byte(`{"id":"ntf_1","type":"charge.succeeded"}`)
	for _, header := range []string{webhook.Sign(body, time.Now(), secret), webhook.Sign(body, time.Now(), "whsec_other"), ""} {
		request := httptest.NewRequest(http.MethodPost, "/webhooks/tally", bytes.NewReader(body))
		request.Header.Set(webhook.SignatureHeader, header)
		response := httptest.NewRecorder()
		handler.ServeHTTP(response, request)
		fmt.Println(strings.TrimSpace(fmt.Sprint(response.Code, " ", response.Body)))
	}
	// Output:
	// 200
	// 400 Tally-Signature does not match: no v1 entry is the body signed with this secret (the wrong secret, or a body changed on the way)
	// 400 no Tally-Signature: the header is missing or empty
}
