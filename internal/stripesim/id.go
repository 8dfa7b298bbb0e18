package stripesim

import (
	"crypto/rand"
)

const idAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// idNew returns prefix followed by n random base62 characters, like Stripe object ids
// ("pi_3OaBc…").
func idNew(prefix string, n int) string {
	buf := make([]byte, n)
	_, _ = rand.Read(buf) // never returns an error (crypto/rand panics instead)
	out := make([]byte, 0, len(prefix)+n)
	out = append(out, prefix...)
	for _, b := range buf {
		out = append(out, idAlphabet[int(b)%len(idAlphabet)])
	}
	return string(out)
}

func idPaymentIntent() string { return idNew("pi_", 24) }
func idCharge() string        { return idNew("ch_", 24) }
func idRefund() string        { return idNew("re_", 24) }
func idDispute() string       { return idNew("dp_", 24) }
func idEvent() string         { return idNew("evt_", 24) }
func idRequest() string       { return idNew("req_", 14) }
func idSecret() string        { return idNew("", 24) }
