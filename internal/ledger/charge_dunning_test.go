package ledger_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

func TestParseDunningSchedule(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	for in, want := range map[string][]time.Duration{
		"3d,5d,7d":     {3 * day, 5 * day, 7 * day},
		" 1d , 36h ":   {day, 36 * time.Hour},
		"90m,2.5d":     {90 * time.Minute, 60 * time.Hour},
		"":             nil,
		"2s,4s":        {2 * time.Second, 4 * time.Second},
		"0.5d,1d,1.5d": {12 * time.Hour, day, 36 * time.Hour},
	} {
		got, err := ledger.ParseDunningSchedule(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for in, why := range map[string]string{
		"3d,2d":   "must increase",
		"3d,3d":   "must increase",
		"3 days":  "not a duration",
		"-1d":     "positive",
		"0s":      "positive",
		"3d,,5d":  "not a duration",
		"weekly":  "not a duration",
		"1d,xd,2": "not a duration",
	} {
		_, err := ledger.ParseDunningSchedule(in)
		require.ErrorContains(t, err, why, in)
	}
	def, err := ledger.ParseDunningSchedule(ledger.DunningScheduleDefault)
	require.NoError(t, err)
	require.Equal(t, []time.Duration{3 * day, 5 * day, 7 * day}, def)
}

func TestDeclineRetryable(t *testing.T) {
	t.Parallel()
	failed := func(typ, code string) ledger.Outcome {
		return ledger.Outcome{Class: ledger.OutcomeFailed, ErrorType: typ, ErrorCode: code}
	}
	for _, o := range []ledger.Outcome{
		failed("card_error", "card_declined"), failed("card_error", "expired_card"),
		failed("card_error", "authentication_required"), failed("card_error", "incorrect_number"),
		failed("", "card_declined"), failed("", "insufficient_funds"), failed("", "requires_payment_method"),
		failed("", "requires_action"), failed("", "authentication_required"),
	} {
		require.True(t, ledger.DeclineRetryable(o), "%+v", o)
	}
	for _, o := range []ledger.Outcome{
		failed("invalid_request_error", "resource_missing"), failed("invalid_request_error", "parameter_missing"),
		failed("", "canceled"), failed("", "payment_intent_authentication_failure"),
		{Class: ledger.OutcomeUnknown, ErrorCode: "card_declined"}, {Class: ledger.OutcomeSucceeded},
	} {
		require.False(t, ledger.DeclineRetryable(o), "%+v", o)
	}
}
