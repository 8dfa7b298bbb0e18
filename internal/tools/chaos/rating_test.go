package chaos

import (
	"math/big"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRateQuantity holds the check's own rating to amounts worked out by
// hand from the run's two plan versions: tier bounds exactly, just past
// them, zero, minimums, packages started, and halves of a cent rounded up.
func TestRateQuantity(t *testing.T) {
	t.Parallel()
	v1, v2 := chaosPlanVersions[0].Prices, chaosPlanVersions[1].Prices
	for _, tc := range []struct {
		price    priceDef
		quantity string
		exact    string // in lowest terms, as big.Rat writes it
		cents    int64
	}{
		{v1["api_calls"], "0", "0", 0},
		{v1["api_calls"], "0.001", "1/2000", 0},            // 0.0005 of a cent
		{v1["api_calls"], "1", "1/2", 1},                   // half a cent rounds up
		{v1["api_calls"], "3", "3/2", 2},                   // 1.5
		{v1["api_calls"], "1000", "500", 500},              // the first bound: no flat amount yet
		{v1["api_calls"], "1000.001", "2400001/4000", 600}, // 500 + 0.00025 + 100
		{v1["api_calls"], "10000", "2850", 2850},           // 500 + 9000 × 0.25 + 100
		{v1["api_calls"], "10001", "28501/10", 2850},       // + 0.1
		{v1["storage_gb"], "0", "0", 0},                    // no usage, no minimum
		{v1["storage_gb"], "0.5", "75", 75},                // 15.25, below the minimum
		{v1["storage_gb"], "10", "305", 305},               // the whole of it at the first tier
		{v1["storage_gb"], "10.001", "12501/50", 250},      // 10.001 × 20 + 50 = 250.02
		{v1["storage_gb"], "100", "2050", 2050},
		{v1["storage_gb"], "100.001", "100001/80", 1250}, // 1250.0125
		{v1["seats"], "0", "0", 0},
		{v1["seats"], "5", "1999/2", 1000}, // one package, 999.5
		{v1["seats"], "5.001", "1999", 1999},
		{v1["seats"], "7.5", "1999", 1999},
		{v1["seats"], "10", "1999", 1999},
		{v2["api_calls"], "1", "250", 250}, // 0.45, below the minimum
		{v2["api_calls"], "1000", "450", 450},
		{v2["api_calls"], "1001", "4907/10", 491}, // 450 + 0.2 + 40.5
		{v2["storage_gb"], "100.5", "2811/2", 1406},
		{v2["seats"], "10", "2000", 2000},       // 1800.25, below the minimum
		{v2["seats"], "10.001", "7201/2", 3601}, // two packages, 3600.5
	} {
		q, err := rat(tc.quantity)
		require.NoError(t, err)
		exact, cents, err := rateQuantity(tc.price, q)
		require.NoError(t, err)
		require.Equal(t, tc.exact, exact.RatString(), "%s %s", tc.price.Model, tc.quantity)
		require.Equal(t, tc.cents, cents, "%s %s", tc.price.Model, tc.quantity)
	}
	_, _, err := rateQuantity(v1["seats"], mustRat(t, "-1"))
	require.Error(t, err)
}

func mustRat(t *testing.T, s string) *big.Rat {
	t.Helper()
	r, err := rat(s)
	require.NoError(t, err)
	return r
}
