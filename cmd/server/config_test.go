package main

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/webhook"
)

// testEnv returns a getenv over a valid base environment with overrides; an
// override of "" unsets the variable.
func testEnv(overrides map[string]string) func(string) string {
	env := map[string]string{
		"DATABASE_URL":   "postgres://tally@127.0.0.1:5432/tally",
		"STRIPE_API_KEY": "rk_test_123",
	}
	for k, v := range overrides {
		env[k] = v
	}
	return func(k string) string { return env[k] }
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()

	t.Run("BadVariableIsNamed", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			name string
			env  map[string]string
		}{
			{"DATABASE_URL", map[string]string{"DATABASE_URL": ""}},
			{"DATABASE_URL", map[string]string{"DATABASE_URL": "   "}},
			{"TALLY_POOLER_URL", map[string]string{"TALLY_POOLER_URL": "postgres://u:pw@h:notaport/db"}},
			{"STRIPE_API_BASE", map[string]string{"STRIPE_API_BASE": "localhost:12111"}},
			{"STRIPE_API_KEY", map[string]string{"STRIPE_API_KEY": ""}},
			{"STRIPE_API_KEY", map[string]string{"STRIPE_API_KEY": "pk_test_123"}},
			{"STRIPE_TIMEOUT", map[string]string{"STRIPE_TIMEOUT": "-1s"}},
			{"STRIPE_TIMEOUT", map[string]string{"STRIPE_TIMEOUT": "0s"}},
			{"STRIPE_TIMEOUT", map[string]string{"STRIPE_TIMEOUT": "30"}},
			{"STRIPE_WEBHOOK_SECRET", map[string]string{"STRIPE_WEBHOOK_SECRET": "secret"}},
			{"TALLY_ALLOW_LIVE_SECRET_KEY", map[string]string{"TALLY_ALLOW_LIVE_SECRET_KEY": "maybe"}},
			{"TALLY_CLOSE_GRACE", map[string]string{"TALLY_CLOSE_GRACE": "abc"}},
			{"TALLY_STRIPE_KEY_WINDOW", map[string]string{"TALLY_STRIPE_KEY_WINDOW": "24h"}},
			{"TALLY_STRIPE_KEY_WINDOW", map[string]string{"TALLY_STRIPE_KEY_WINDOW": "23h59m", "STRIPE_TIMEOUT": "1s"}},
			{"TALLY_LOG_LEVEL", map[string]string{"TALLY_LOG_LEVEL": "loud"}},
			{"TALLY_PERIOD", map[string]string{"TALLY_PERIOD": "week"}},
			{"TALLY_PERIOD_BUDGET_CENTS", map[string]string{"TALLY_PERIOD_BUDGET_CENTS": "-5"}},
			{"TALLY_ANOMALY_FACTOR", map[string]string{"TALLY_ANOMALY_FACTOR": "ten"}},
			{"TALLY_NAMESPACE", map[string]string{"TALLY_NAMESPACE": "Prod East"}},
			{"TALLY_API_DB_MAX_CONNS", map[string]string{"TALLY_API_DB_MAX_CONNS": "0"}},
			{"TALLY_API_DB_MAX_CONNS", map[string]string{"TALLY_API_DB_MAX_CONNS": "lots"}},
			{"TALLY_DB_MAX_CONNS", map[string]string{"TALLY_DB_MAX_CONNS": "-1"}},
			{"TALLY_WORKER_DB_MAX_CONNS", map[string]string{"TALLY_WORKER_DB_MAX_CONNS": "1"}},
			{"TALLY_WORKER_DB_MAX_CONNS", map[string]string{"TALLY_WORKER_DB_MAX_CONNS": "100000"}},
			{"TALLY_ROLES", map[string]string{"TALLY_ROLES": "foo"}},
			{"TALLY_ROLES", map[string]string{"TALLY_ROLES": "api,foo"}},
			{"TALLY_ROLES", map[string]string{"TALLY_ROLES": ","}},
			{"TALLY_STRIPE_KEY_WINDOW", map[string]string{"TALLY_STRIPE_KEY_WINDOW": "1 day"}},
			{"TALLY_DEBUG_ADDR", map[string]string{"TALLY_DEBUG_ADDR": ":6060"}},
			{"TALLY_DEBUG_ADDR", map[string]string{"TALLY_DEBUG_ADDR": "0.0.0.0:6060"}},
			{"TALLY_METRICS_ADDR", map[string]string{"TALLY_METRICS_ADDR": ":9464"}},
			{"TALLY_METRICS_ADDR", map[string]string{"TALLY_METRICS_ADDR": "10.0.0.5:9464"}},
			{"TALLY_WORKERS", map[string]string{"TALLY_WORKERS": "0"}},
			{"TALLY_WORKERS", map[string]string{"TALLY_WORKERS": "many"}},
			{"TALLY_DUNNING_SCHEDULE", map[string]string{"TALLY_DUNNING_SCHEDULE": "7d,3d"}},
			{"TALLY_DUNNING_SCHEDULE", map[string]string{"TALLY_DUNNING_SCHEDULE": "weekly"}},
			{"TALLY_DUNNING_INTERVAL", map[string]string{"TALLY_DUNNING_INTERVAL": "0s"}},
			{"TALLY_WEBHOOKS_ALLOW_CIDRS", map[string]string{"TALLY_WEBHOOKS_ALLOW_CIDRS": "10.0.0.0/8,intranet"}},
			{"TALLY_WEBHOOKS_ALLOW_CIDRS", map[string]string{"TALLY_WEBHOOKS_ALLOW_CIDRS": "10.0.0.1"}},
			{"TALLY_WEBHOOKS_ALLOW_HTTP", map[string]string{"TALLY_WEBHOOKS_ALLOW_HTTP": "sometimes"}},
		}
		for _, tc := range cases {
			c, err := loadConfig(testEnv(tc.env))
			require.Error(t, err, "%v", tc.env)
			require.Nil(t, c)
			require.Contains(t, err.Error(), tc.name+":", "%v", tc.env)
		}
	})

	t.Run("PoolerURLErrorHidesItsPassword", func(t *testing.T) {
		t.Parallel()
		_, err := loadConfig(testEnv(map[string]string{"TALLY_POOLER_URL": "postgres://tally:s3cr3t-pw@pgbouncer:port/tally"}))
		require.ErrorContains(t, err, "TALLY_POOLER_URL:")
		require.NotContains(t, err.Error(), "s3cr3t-pw")
		c, err := loadConfig(testEnv(map[string]string{"TALLY_POOLER_URL": "postgres://tally@pgbouncer:6432/tally"}))
		require.NoError(t, err)
		require.Equal(t, "postgres://tally@pgbouncer:6432/tally", c.PoolerURL)
	})

	t.Run("DunningSchedule", func(t *testing.T) {
		t.Parallel()
		day := 24 * time.Hour
		c, err := loadConfig(testEnv(nil))
		require.NoError(t, err)
		require.Equal(t, []time.Duration{3 * day, 5 * day, 7 * day}, c.DunningSchedule, "the default")
		require.Equal(t, time.Minute, c.DunningInterval)
		c, err = loadConfig(testEnv(map[string]string{"TALLY_DUNNING_SCHEDULE": "1d, 36h", "TALLY_DUNNING_INTERVAL": "10s"}))
		require.NoError(t, err)
		require.Equal(t, []time.Duration{day, 36 * time.Hour}, c.DunningSchedule)
		require.Equal(t, 10*time.Second, c.DunningInterval)
		c, err = loadConfig(testEnv(map[string]string{"TALLY_DUNNING_SCHEDULE": "off"}))
		require.NoError(t, err)
		require.Empty(t, c.DunningSchedule, "off: declines are final")
	})

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		c, err := loadConfig(testEnv(nil))
		require.NoError(t, err)
		// The documented defaults (docs/design.md, Configuration: README's table).
		require.Equal(t, "postgres://tally@127.0.0.1:5432/tally", c.DatabaseURL)
		require.Equal(t, ":8080", c.HTTPAddr)
		require.Equal(t, []string{"api", "worker"}, c.Roles)
		require.Equal(t, 50, c.Workers)
		require.Equal(t, ledger.CadenceMonth, c.Cadence)
		require.Equal(t, time.Hour, c.CloseGrace)
		require.Zero(t, c.PeriodBudgetCents)
		require.Equal(t, ledger.AnomalyFactorDefault, c.AnomalyFactor)
		require.Equal(t, ledger.NamespaceDefault, c.Namespace)
		require.Equal(t, 23*time.Hour, c.StripeKeyWindow)
		require.Equal(t, "rk_test_123", c.StripeAPIKey)
		require.Empty(t, c.StripeAPIBase)
		require.Empty(t, c.StripeWebhookSecret)
		require.Equal(t, 30*time.Second, c.StripeTimeout)
		require.False(t, c.AllowLiveSecretKey)
		require.Equal(t, slog.LevelInfo, c.LogLevel)
		require.Equal(t, 25*time.Second, c.ShutdownTimeout)
		require.Equal(t, int32(8), c.APIDBMaxConns)
		require.Equal(t, int32(10), c.WorkerDBMaxConns)
		require.False(t, c.DBMaxConnsDeprecated)
		require.Empty(t, c.WebhooksAllow, "public addresses only")
		require.False(t, c.WebhooksAllowHTTP)
	})

	t.Run("EveryProblemAtOnce", func(t *testing.T) {
		t.Parallel()
		_, err := loadConfig(testEnv(map[string]string{
			"DATABASE_URL": "", "TALLY_PERIOD": "week", "TALLY_WORKERS": "0", "STRIPE_TIMEOUT": "-1s",
		}))
		require.Error(t, err)
		for _, name := range []string{"DATABASE_URL", "TALLY_PERIOD", "TALLY_WORKERS", "STRIPE_TIMEOUT"} {
			require.Contains(t, err.Error(), name+":")
		}
	})

	t.Run("LiveSecretKeyAllowedExplicitly", func(t *testing.T) {
		t.Parallel()
		for _, v := range []string{"true", "1", "yes", "TRUE"} {
			c, err := loadConfig(testEnv(map[string]string{"STRIPE_API_KEY": "sk_live_abc", "TALLY_ALLOW_LIVE_SECRET_KEY": v}))
			require.NoError(t, err, v)
			require.True(t, c.AllowLiveSecretKey)
			require.Equal(t, "sk_live_abc", c.StripeAPIKey)
		}
	})

	t.Run("LiveSecretKeyRefused", func(t *testing.T) {
		t.Parallel()
		for _, allow := range []string{"", "false"} {
			_, err := loadConfig(testEnv(map[string]string{"STRIPE_API_KEY": "sk_live_supersecret", "TALLY_ALLOW_LIVE_SECRET_KEY": allow}))
			require.Error(t, err)
			require.Contains(t, err.Error(), "STRIPE_API_KEY:")
			require.Contains(t, err.Error(), "TALLY_ALLOW_LIVE_SECRET_KEY")
			require.NotContains(t, err.Error(), "supersecret", "the key must not be echoed")
		}
		// Restricted live keys and test secret keys are fine.
		for _, key := range []string{"rk_live_abc", "sk_test_abc"} {
			_, err := loadConfig(testEnv(map[string]string{"STRIPE_API_KEY": key}))
			require.NoError(t, err, key)
		}
	})

	t.Run("MetricsAddrOffLoopbackNeedsToken", func(t *testing.T) {
		t.Parallel()
		for _, addr := range []string{"127.0.0.1:9464", "[::1]:9464", "localhost:9464", "off"} {
			c, err := loadConfig(testEnv(map[string]string{"TALLY_METRICS_ADDR": addr}))
			require.NoError(t, err, addr)
			require.Equal(t, addr, c.MetricsAddr)
		}
		_, err := loadConfig(testEnv(map[string]string{"TALLY_METRICS_ADDR": ":9464"}))
		require.ErrorContains(t, err, "TALLY_METRICS_ADDR:")
		require.ErrorContains(t, err, "TALLY_METRICS_TOKEN")
		c, err := loadConfig(testEnv(map[string]string{"TALLY_METRICS_ADDR": ":9464", "TALLY_METRICS_TOKEN": "0123456789abcdef"}))
		require.NoError(t, err)
		require.Equal(t, ":9464", c.MetricsAddr)
	})

	t.Run("Overrides", func(t *testing.T) {
		t.Parallel()
		c, err := loadConfig(testEnv(map[string]string{
			"TALLY_HTTP_ADDR":             "127.0.0.1:9999",
			"TALLY_ROLES":                 " worker , api,worker ",
			"TALLY_WORKERS":               "7",
			"TALLY_PERIOD":                "hour",
			"TALLY_CLOSE_GRACE":           "15m",
			"TALLY_PERIOD_BUDGET_CENTS":   "100000",
			"TALLY_STRIPE_KEY_WINDOW":     "20h",
			"STRIPE_API_BASE":             "http://127.0.0.1:12111",
			"STRIPE_WEBHOOK_SECRET":       "whsec_x",
			"STRIPE_TIMEOUT":              "5s",
			"TALLY_LOG_LEVEL":             "debug",
			"TALLY_SHUTDOWN_TIMEOUT":      "3s",
			"TALLY_DB_MAX_CONNS":          "12",
			"TALLY_ALLOW_LIVE_SECRET_KEY": "no",
		}))
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1:9999", c.HTTPAddr)
		require.Equal(t, []string{"worker", "api"}, c.Roles)
		require.Equal(t, 7, c.Workers)
		require.Equal(t, ledger.CadenceHour, c.Cadence)
		require.Equal(t, 15*time.Minute, c.CloseGrace)
		require.Equal(t, int64(100000), c.PeriodBudgetCents)
		require.Equal(t, 20*time.Hour, c.StripeKeyWindow)
		require.Equal(t, "http://127.0.0.1:12111", c.StripeAPIBase)
		require.Equal(t, "whsec_x", c.StripeWebhookSecret)
		require.Equal(t, 5*time.Second, c.StripeTimeout)
		require.Equal(t, slog.LevelDebug, c.LogLevel)
		require.Equal(t, 3*time.Second, c.ShutdownTimeout)
		require.Equal(t, int32(12), c.APIDBMaxConns)
		require.Equal(t, int32(12), c.WorkerDBMaxConns)
		require.True(t, c.DBMaxConnsDeprecated)
		require.False(t, c.AllowLiveSecretKey)
	})

	t.Run("PoolSizes", func(t *testing.T) {
		t.Parallel()
		c, err := loadConfig(testEnv(map[string]string{"TALLY_API_DB_MAX_CONNS": "3", "TALLY_WORKER_DB_MAX_CONNS": "20"}))
		require.NoError(t, err)
		require.Equal(t, int32(3), c.APIDBMaxConns)
		require.Equal(t, int32(20), c.WorkerDBMaxConns)
		require.False(t, c.DBMaxConnsDeprecated)

		// The deprecated TALLY_DB_MAX_CONNS is each pool's default; a pool's
		// own variable wins.
		c, err = loadConfig(testEnv(map[string]string{"TALLY_DB_MAX_CONNS": "25", "TALLY_WORKER_DB_MAX_CONNS": "6"}))
		require.NoError(t, err)
		require.Equal(t, int32(25), c.APIDBMaxConns)
		require.Equal(t, int32(6), c.WorkerDBMaxConns)
		require.True(t, c.DBMaxConnsDeprecated)

		// 0 kept its documented meaning, the default.
		c, err = loadConfig(testEnv(map[string]string{"TALLY_DB_MAX_CONNS": "0"}))
		require.NoError(t, err)
		require.Equal(t, int32(8), c.APIDBMaxConns)
		require.Equal(t, int32(10), c.WorkerDBMaxConns)
	})

	t.Run("StripeKeyNotNeededWithoutWorkerRole", func(t *testing.T) {
		t.Parallel()
		c, err := loadConfig(testEnv(map[string]string{"TALLY_ROLES": "api", "STRIPE_API_KEY": ""}))
		require.NoError(t, err)
		require.Equal(t, []string{"api"}, c.Roles)

		_, err = loadConfig(testEnv(map[string]string{"TALLY_ROLES": "worker", "STRIPE_API_KEY": ""}))
		require.ErrorContains(t, err, "STRIPE_API_KEY:")
	})

	t.Run("WebhooksAllowCIDRs", func(t *testing.T) {
		t.Parallel()
		c, err := loadConfig(testEnv(map[string]string{"TALLY_WEBHOOKS_ALLOW_CIDRS": " 10.20.0.0/16, fd12::/16 "}))
		require.NoError(t, err)
		require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd12::/16")}, c.WebhooksAllow)

		_, err = loadConfig(testEnv(map[string]string{"TALLY_WEBHOOKS_ALLOW_CIDRS": "10.0.0.0/8, 192.168.1.1/16"}))
		require.ErrorContains(t, err, `TALLY_WEBHOOKS_ALLOW_CIDRS: "192.168.1.1/16" has bits set past its /16; the network is 192.168.0.0/16`)

		// The deprecated TALLY_WEBHOOKS_ALLOW_HTTP=true allows loopback.
		c, err = loadConfig(testEnv(map[string]string{"TALLY_WEBHOOKS_ALLOW_CIDRS": "10.20.0.0/16", "TALLY_WEBHOOKS_ALLOW_HTTP": "true"}))
		require.NoError(t, err)
		require.Equal(t, append([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}, webhook.LoopbackNetworks()...), c.WebhooksAllow)
		require.True(t, c.WebhooksAllowHTTP)
	})
}
