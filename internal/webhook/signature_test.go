package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	stripewebhook "github.com/stripe/stripe-go/v76/webhook"
)

// testNow is the receiver's clock in every test: no test reads the wall clock.
var testNow = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	testBody   = `{"id":"ntf_1","type":"charge.succeeded"}`
	testSecret = "whsec_test"
)

// hmacHex is the scheme written out independently of the package: the hex
// HMAC-SHA256 of "<t>.<body>" keyed by secret.
func hmacHex(t int64, body, secret string) string {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(itoa(t) + "." + body))
	return hex.EncodeToString(h.Sum(nil))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestSignKnownAnswer(t *testing.T) {
	t.Parallel()

	at := testNow
	require.Equal(t, int64(1767225600), at.Unix())

	// Pinned: computed with `openssl dgst -sha256 -hmac whsec_test` over
	// "1767225600.{body}", and independently here with crypto/hmac.
	const pinned = "9a508dbaf8d17de00847451369dd5fe058620e4e48495d009bd9fd19634bd669"
	require.Equal(t, pinned, hmacHex(1767225600, testBody, testSecret))

	require.Equal(t, "t=1767225600,v1="+pinned, Sign([]byte(testBody), at, testSecret))
	require.Equal(t, "t=1767225600,v1="+pinned+",v1="+hmacHex(1767225600, testBody, "whsec_previous"),
		Sign([]byte(testBody), at, testSecret, "whsec_previous"), "one v1 per secret, in order")
	// Sub-second parts are dropped: t is whole unix seconds.
	require.Equal(t, "t=1767225600,v1="+pinned, Sign([]byte(testBody), at.Add(999*time.Millisecond), testSecret))
	// An empty secret signs nothing.
	require.Equal(t, "t=1767225600", Sign([]byte(testBody), at, ""))
	require.Equal(t, "t=1767225600,v1="+pinned, Sign([]byte(testBody), at, "", testSecret))
}

// TestStripeCompatible checks the scheme is Stripe's, both ways: stripe-go
// verifies what Sign writes, and Verify accepts what stripe-go signs.
func TestStripeCompatible(t *testing.T) {
	t.Parallel()

	header := Sign([]byte(testBody), testNow, testSecret)
	require.NoError(t, stripewebhook.ValidatePayloadIgnoringTolerance([]byte(testBody), header, testSecret))
	require.Error(t, stripewebhook.ValidatePayloadIgnoringTolerance([]byte(testBody), header, "whsec_other"))

	signed := stripewebhook.GenerateTestSignedPayload(&stripewebhook.UnsignedPayload{
		Payload: []byte(testBody), Secret: testSecret, Timestamp: testNow})
	require.NoError(t, Verify(signed.Payload, signed.Header, testSecret, DefaultTolerance, testNow))
}

func TestVerify(t *testing.T) {
	t.Parallel()

	body := []byte(testBody)
	tests := []struct {
		name    string
		body    []byte
		header  string
		secret  string
		now     time.Time
		wantErr error
	}{
		{"RoundTrip", body, Sign(body, testNow, testSecret), testSecret, testNow, nil},
		{"EmptyBody", []byte{}, Sign(nil, testNow, testSecret), testSecret, testNow, nil},
		{"RotationNewSecret", body, Sign(body, testNow, testSecret, "whsec_previous"), testSecret, testNow, nil},
		{"RotationPreviousSecret", body, Sign(body, testNow, testSecret, "whsec_previous"), "whsec_previous", testNow, nil},
		{"EntriesInAnyOrder", body, "v1=" + hmacHex(testNow.Unix(), testBody, testSecret) + ",t=" + itoa(testNow.Unix()), testSecret, testNow, nil},
		{"UnknownSchemesIgnored", body, "t=" + itoa(testNow.Unix()) + ",v0=abc,v1=" + hmacHex(testNow.Unix(), testBody, testSecret) + ",v2=def", testSecret, testNow, nil},
		{"SpacesAroundEntries", body, "t=" + itoa(testNow.Unix()) + ", v1=" + hmacHex(testNow.Unix(), testBody, testSecret), testSecret, testNow, nil},
		{"BadV1BesideGoodV1", body, "t=" + itoa(testNow.Unix()) + ",v1=zz,v1=" + hmacHex(testNow.Unix(), testBody, testSecret), testSecret, testNow, nil},

		{"WrongSecret", body, Sign(body, testNow, testSecret), "whsec_other", testNow, ErrSignature},
		{"RotationNeitherSecret", body, Sign(body, testNow, testSecret, "whsec_previous"), "whsec_other", testNow, ErrSignature},
		{"TamperedBody", []byte(`{"id":"ntf_1","type":"charge.failed"}`), Sign(body, testNow, testSecret), testSecret, testNow, ErrSignature},
		{"TamperedTimestamp", body, "t=" + itoa(testNow.Unix()+1) + ",v1=" + hmacHex(testNow.Unix(), testBody, testSecret), testSecret, testNow, ErrSignature},
		{"V1NotHex", body, "t=" + itoa(testNow.Unix()) + ",v1=not-hex", testSecret, testNow, ErrSignature},
		{"V1Empty", body, "t=" + itoa(testNow.Unix()) + ",v1=", testSecret, testNow, ErrSignature},
		{"SignatureOnlyAsV0", body, "t=" + itoa(testNow.Unix()) + ",v0=" + hmacHex(testNow.Unix(), testBody, testSecret) + ",v1=00", testSecret, testNow, ErrSignature},

		{"AtToleranceInThePast", body, Sign(body, testNow.Add(-DefaultTolerance), testSecret), testSecret, testNow, nil},
		{"AtToleranceInTheFuture", body, Sign(body, testNow.Add(DefaultTolerance), testSecret), testSecret, testNow, nil},
		{"Stale", body, Sign(body, testNow.Add(-DefaultTolerance-time.Second), testSecret), testSecret, testNow, ErrTimestamp},
		{"Future", body, Sign(body, testNow.Add(DefaultTolerance+time.Second), testSecret), testSecret, testNow, ErrTimestamp},
		{"LongAgo", body, Sign(body, time.Unix(0, 0), testSecret), testSecret, testNow, ErrTimestamp},
		{"TimestampMinInt64", body, "t=-9223372036854775808,v1=" + hmacHex(-1<<63, testBody, testSecret), testSecret, testNow, ErrTimestamp},
		{"TimestampMaxInt64", body, "t=9223372036854775807,v1=" + hmacHex(1<<63-1, testBody, testSecret), testSecret, testNow, ErrTimestamp},

		{"Empty", body, "", testSecret, testNow, ErrNoSignature},
		{"Blank", body, "  ", testSecret, testNow, ErrNoSignature},
		{"NoV1", body, "t=" + itoa(testNow.Unix()), testSecret, testNow, ErrNoSignature},
		{"OnlyV0", body, "t=" + itoa(testNow.Unix()) + ",v0=" + hmacHex(testNow.Unix(), testBody, testSecret), testSecret, testNow, ErrNoSignature},
		{"Garbage", body, "garbage", testSecret, testNow, ErrNoSignature},
		{"GarbageEntry", body, Sign(body, testNow, testSecret) + ",garbage", testSecret, testNow, ErrNoSignature},
		{"TrailingComma", body, Sign(body, testNow, testSecret) + ",", testSecret, testNow, ErrNoSignature},
		{"NoT", body, "v1=" + hmacHex(testNow.Unix(), testBody, testSecret), testSecret, testNow, ErrTimestamp},
		{"TNotANumber", body, "t=yesterday,v1=" + hmacHex(testNow.Unix(), testBody, testSecret), testSecret, testNow, ErrTimestamp},
		{"TEmpty", body, "t=,v1=" + hmacHex(testNow.Unix(), testBody, testSecret), testSecret, testNow, ErrTimestamp},
		{"TFractional", body, "t=1767225600.5,v1=" + hmacHex(testNow.Unix(), testBody, testSecret), testSecret, testNow, ErrTimestamp},
		{"TTwice", body, "t=" + itoa(testNow.Unix()) + "," + Sign(body, testNow, testSecret), testSecret, testNow, ErrTimestamp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := Verify(tt.body, tt.header, tt.secret, DefaultTolerance, tt.now)
			if tt.wantErr == nil {
				require.NoError(t, err)
				return
			}
			// The one sentinel wanted, and none of the others.
			for _, sentinel := range []error{ErrNoSignature, ErrTimestamp, ErrSignature} {
				require.Equal(t, errors.Is(tt.wantErr, sentinel), errors.Is(err, sentinel), "errors.Is(%q, %q)", err, sentinel)
			}
		})
	}
}

func TestVerifyTolerance(t *testing.T) {
	t.Parallel()

	body := []byte(testBody)
	header := Sign(body, testNow, testSecret)

	// A tolerance of its own.
	require.NoError(t, Verify(body, header, testSecret, time.Hour, testNow.Add(time.Hour)))
	require.ErrorIs(t, Verify(body, header, testSecret, time.Hour, testNow.Add(time.Hour+time.Second)), ErrTimestamp)
	require.ErrorIs(t, Verify(body, header, testSecret, time.Second, testNow.Add(-2*time.Second)), ErrTimestamp)

	// Zero or less is DefaultTolerance: the check cannot be turned off.
	for _, tolerance := range []time.Duration{0, -time.Second} {
		require.NoError(t, Verify(body, header, testSecret, tolerance, testNow.Add(DefaultTolerance)))
		require.ErrorIs(t, Verify(body, header, testSecret, tolerance, testNow.Add(DefaultTolerance+time.Second)), ErrTimestamp)
	}

	// A stale header with the wrong secret is a signature error: the
	// timestamp is only judged once the header is known to come from Tally.
	require.ErrorIs(t, Verify(body, header, "whsec_other", DefaultTolerance, testNow.Add(time.Hour)), ErrSignature)
}

func TestVerifyErrorMessages(t *testing.T) {
	t.Parallel()

	body := []byte(testBody)
	err := Verify(body, Sign(body, testNow.Add(-10*time.Minute), testSecret), testSecret, DefaultTolerance, testNow)
	require.EqualError(t, err, "bad Tally-Signature timestamp: t 2025-12-31T23:50:00Z is 10m0s from now, more than the tolerance of 5m0s")

	err = Verify(body, "t=yesterday,v1=00", testSecret, DefaultTolerance, testNow)
	require.EqualError(t, err, `bad Tally-Signature timestamp: t "yesterday" is not unix seconds`)

	err = Verify(body, Sign(body, testNow, testSecret, "whsec_previous"), "whsec_other", DefaultTolerance, testNow)
	require.EqualError(t, err, "Tally-Signature does not match: no v1 entry is the body signed with this secret (the wrong secret, or a body changed on the way)")

	// What the sender wrote is quoted, but bounded.
	err = Verify(body, strings.Repeat("x", 10_000), testSecret, DefaultTolerance, testNow)
	require.ErrorIs(t, err, ErrNoSignature)
	require.Less(t, len(err.Error()), 200)
}

func TestVerifyEmptySecret(t *testing.T) {
	t.Parallel()

	// Anyone can compute an HMAC keyed by the empty string: a receiver whose
	// secret is unset must refuse everything, not accept a forgery.
	body := []byte(testBody)
	forged := "t=" + itoa(testNow.Unix()) + ",v1=" + hmacHex(testNow.Unix(), testBody, "")
	err := Verify(body, forged, "", DefaultTolerance, testNow)
	require.EqualError(t, err, "error verifying a webhook: the secret is empty")
}

func TestNewSecret(t *testing.T) {
	t.Parallel()

	seen := make(map[string]bool)
	for range 100 {
		secret, err := NewSecret()
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(secret, "whsec_"), secret)
		require.Len(t, secret, len("whsec_")+43)
		key, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		require.NoError(t, err)
		require.Len(t, key, 32)
		require.False(t, seen[secret], "secret %s returned twice", secret)
		seen[secret] = true

		// It signs and verifies.
		header := Sign([]byte(testBody), testNow, secret)
		require.NoError(t, Verify([]byte(testBody), header, secret, DefaultTolerance, testNow))
	}
}
