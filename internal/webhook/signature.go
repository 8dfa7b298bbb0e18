// Package webhook signs the webhooks Tally sends to its producers, and
// verifies them on the receiving side. The scheme is Stripe's, so a producer
// who verifies Stripe's webhooks already knows it.
//
// Every request carries a Tally-Signature header:
//
//	Tally-Signature: t=1767225600,v1=9a508dbaf8d17de00847451369dd5fe058620e4e48495d009bd9fd19634bd669
//
// t is the time of sending in unix seconds. Each v1 is the lower-case hex
// HMAC-SHA256 of the signed payload: the t value as sent, a dot, and the raw
// request body, byte for byte (before any JSON parsing), keyed by the
// endpoint's secret (the whole whsec_… string). During a secret rotation's
// grace period Tally signs with both the new and the previous secret, so the
// header holds two v1 entries; a receiver accepts when any one of them
// matches its secret. Entries may come in any order, and schemes other than
// v1 (v0, …) are ignored.
//
// A receiver also checks that t is within a tolerance of its own clock
// (DefaultTolerance, five minutes): the signature covers t, so a captured
// request cannot be replayed later with a fresh time. A replay within the
// tolerance still verifies, and Tally retries a delivery until it gets a 2xx
// answer, so the same notification can arrive more than once: receivers drop
// duplicates by the notification's id.
//
// Sign is the sending side; Verify is the receiving side, for receivers
// written in Go.
//
// AddressPolicy decides where the sending side may deliver: public
// addresses only, unless an operator allows a non-public network
// (TALLY_WEBHOOKS_ALLOW_CIDRS). Tally checks it when an endpoint is created
// and on every address a delivery dials.
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader is the HTTP header that carries the signature.
const SignatureHeader = "Tally-Signature"

// DefaultTolerance is how far the header's t may be from the receiver's
// clock, either way, for Verify to accept it (Stripe's default too).
const DefaultTolerance = 5 * time.Minute

// secretPrefix starts every secret NewSecret returns.
const secretPrefix = "whsec_"

// ErrNoSignature is returned by Verify when the request carries no
// signature: the header is missing or empty, is not a list of key=value
// entries, or holds no v1 entry.
var ErrNoSignature = errors.New("no " + SignatureHeader)

// ErrTimestamp is returned by Verify when the header's t is missing,
// repeated or not a number, or is further from now than the tolerance (a
// replayed request, or a receiver's clock that is off).
var ErrTimestamp = errors.New("bad " + SignatureHeader + " timestamp")

// ErrSignature is returned by Verify when no v1 entry of the header matches
// the body signed with the secret: the wrong secret, or a body changed on the
// way.
var ErrSignature = errors.New(SignatureHeader + " does not match")

// Sign returns the Tally-Signature header value for body sent at at: its unix
// seconds, and one v1 entry per secret, in the order given. Empty secrets are
// skipped (an HMAC keyed by nothing proves nothing); with no secret left the
// value has no v1 entry, and Verify refuses it with ErrNoSignature.
func Sign(body []byte, at time.Time, secrets ...string) string {
	t := strconv.FormatInt(at.Unix(), 10)
	var b strings.Builder
	b.WriteString("t=" + t)
	for _, secret := range secrets {
		if secret == "" {
			continue
		}
		b.WriteString(",v1=" + hex.EncodeToString(mac(t, body, secret)))
	}
	return b.String()
}

// Verify checks header, a Tally-Signature value, against body and secret at
// now: it returns nil when the header's t is within tolerance of now, either
// way, and one of its v1 entries is the HMAC of body with secret. A
// tolerance of zero or less means DefaultTolerance; the check cannot be
// turned off. Otherwise the error matches (errors.Is) ErrNoSignature,
// ErrTimestamp or ErrSignature, and says what was wrong; an empty secret is
// refused with an error of its own, as it would accept a forgery.
//
// A t outside the tolerance is only reported once the signature matches, so
// ErrTimestamp for a t that parses means the request was signed with the
// secret: a replay, a delivery delayed on the way, or a clock that is off.
func Verify(body []byte, header string, secret string, tolerance time.Duration, now time.Time) error {
	if secret == "" {
		return errors.New("error verifying a webhook: the secret is empty")
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if strings.TrimSpace(header) == "" {
		return fmt.Errorf("%w: the header is missing or empty", ErrNoSignature)
	}
	var (
		t       string
		hasT    bool
		v1s     []string
		entries = strings.Split(header, ",")
	)
	for _, entry := range entries {
		key, value, ok := strings.Cut(strings.TrimSpace(entry), "=")
		if !ok {
			return fmt.Errorf("%w: entry %q is not key=value", ErrNoSignature, truncate(entry))
		}
		switch key {
		case "t":
			if hasT {
				return fmt.Errorf("%w: t appears more than once", ErrTimestamp)
			}
			t, hasT = value, true
		case "v1":
			v1s = append(v1s, value)
		}
	}
	if len(v1s) == 0 {
		return fmt.Errorf("%w: the header has no v1 entry", ErrNoSignature)
	}
	if !hasT {
		return fmt.Errorf("%w: the header has no t entry", ErrTimestamp)
	}
	unix, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: t %q is not unix seconds", ErrTimestamp, truncate(t))
	}

	expected := mac(t, body, secret)
	matched := false
	for _, v1 := range v1s {
		got, err := hex.DecodeString(v1)
		if err == nil && hmac.Equal(got, expected) {
			matched = true
			break
		}
	}
	if !matched {
		return fmt.Errorf("%w: no v1 entry is the body signed with this secret (the wrong secret, or a body changed on the way)", ErrSignature)
	}

	// Sub saturates, so a t far out of range cannot wrap round into the window.
	skew := now.Sub(time.Unix(unix, 0))
	if skew > tolerance || skew < -tolerance {
		return fmt.Errorf("%w: t %s is %s from now, more than the tolerance of %s",
			ErrTimestamp, time.Unix(unix, 0).UTC().Format(time.RFC3339), skew.Round(time.Second), tolerance)
	}
	return nil
}

// NewSecret returns a new signing secret: whsec_ and 32 random bytes in
// unpadded base64url (49 characters in all).
func NewSecret() (string, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("error reading random bytes for a webhook secret: %w", err)
	}
	return secretPrefix + base64.RawURLEncoding.EncodeToString(key), nil
}

// mac is the HMAC-SHA256 of t, a dot and body, keyed by secret.
func mac(t string, body []byte, secret string) []byte {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(t))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// truncate bounds a piece of the header quoted in an error, as the header
// comes from whoever sent the request.
func truncate(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}
