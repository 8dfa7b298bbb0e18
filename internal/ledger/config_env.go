package ledger

import (
	"strconv"

	"github.com/tally-billing/tally/internal/envconf"
	"github.com/tally-billing/tally/internal/webhook"
)

// ConfigFromEnv reads the settings that decide how charges are made and
// settled from the environment (getenv), with the server's defaults:
// TALLY_PERIOD, TALLY_CLOSE_GRACE, TALLY_STRIPE_KEY_WINDOW,
// TALLY_PERIOD_BUDGET_CENTS, TALLY_ANOMALY_FACTOR, TALLY_NAMESPACE,
// TALLY_DUNNING_SCHEDULE, TALLY_INGEST_GROUP_MAX, TALLY_INGEST_WRITERS,
// TALLY_WEBHOOKS_ALLOW_CIDRS (and the deprecated
// TALLY_WEBHOOKS_ALLOW_HTTP). Every process that
// settles a charge (the server, billingctl) builds its ledger from it, so a
// decline that billingctl reconcile finds becomes past_due exactly as it
// would in the server. An empty variable means its default. It returns every
// problem at once, each naming its variable; Clock, Scheduler, Logger and
// the other fields are left for the caller.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	env := envconf.New(getenv)
	c := Config{
		CloseGrace:        env.Duration("TALLY_CLOSE_GRACE", CloseGraceDefault),
		StripeKeyWindow:   env.Duration("TALLY_STRIPE_KEY_WINDOW", StripeKeyWindowDefault),
		PeriodBudgetCents: env.Int("TALLY_PERIOD_BUDGET_CENTS", 0, 1, 1<<62),
		Namespace:         env.String("TALLY_NAMESPACE", NamespaceDefault),
		AnomalyFactor:     AnomalyFactorDefault,
		IngestGroupMax:    int(env.Int("TALLY_INGEST_GROUP_MAX", IngestGroupMaxDefault, 1, UsageEventBatchMax)),
		IngestWriters:     int(env.Int("TALLY_INGEST_WRITERS", IngestWritersDefault, 1, 1000)),
	}
	allow, err := webhook.ParseCIDRs(env.String(webhook.AllowVariable, ""))
	if err != nil {
		env.Bad(webhook.AllowVariable, "%v", err)
	}
	c.WebhooksAllow = allow
	// TALLY_WEBHOOKS_ALLOW_HTTP (deprecated) allowed http:// to a loopback
	// host and deliveries to loopback: what allowing loopback's networks
	// does now.
	if env.Bool("TALLY_WEBHOOKS_ALLOW_HTTP") {
		c.WebhooksAllow = append(c.WebhooksAllow, webhook.LoopbackNetworks()...)
	}
	cadence, err := ParseCadence(env.String("TALLY_PERIOD", string(CadenceDefault)))
	if err != nil {
		env.Bad("TALLY_PERIOD", "%v", err)
	}
	c.Cadence = cadence
	if !NamespaceValid(c.Namespace) {
		env.Bad("TALLY_NAMESPACE", "%q: use lower-case letters, digits, _ and -, 1 to 63 of them, such as production or staging", c.Namespace)
	}
	if v := env.String("TALLY_ANOMALY_FACTOR", ""); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1e6 || f != f {
			env.Bad("TALLY_ANOMALY_FACTOR", "%q is not a number between 0 (off) and 1000000, such as 10", v)
		} else {
			c.AnomalyFactor = f
		}
	}
	// "off" turns dunning off (declines are final).
	if v := env.String("TALLY_DUNNING_SCHEDULE", DunningScheduleDefault); v != "off" {
		schedule, err := ParseDunningSchedule(v)
		if err != nil {
			env.Bad("TALLY_DUNNING_SCHEDULE", "%v; such as 3d,5d,7d (retries 3, 5 and 7 days after the first decline), or off", err)
		}
		c.DunningSchedule = schedule
	}
	return c, env.Err()
}
