package ledger_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
)

func TestPeriodListPage(t *testing.T) {
	t.Parallel()

	// labels returns the labels of periods.
	labels := func(periods []*ledger.Period) []string {
		out := make([]string, len(periods))
		for i, p := range periods {
			out[i] = p.Period
		}
		return out
	}

	t.Run("BadParams", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		for _, tc := range []struct {
			p     ledger.PeriodListParams
			field string
		}{
			{ledger.PeriodListParams{CustomerID: "acme", Limit: -1}, "limit"},
			{ledger.PeriodListParams{CustomerID: "acme", Limit: ledger.PeriodListLimitMax + 1}, "limit"},
			{ledger.PeriodListParams{CustomerID: "acme", StartingAfter: "2026-13"}, "starting_after"},
			{ledger.PeriodListParams{CustomerID: "acme", StartingAfter: "next"}, "starting_after"},
			{ledger.PeriodListParams{CustomerID: "acme", StartingAfter: "2026-11\x00"}, "starting_after"},
		} {
			_, _, err := b.Ledger.PeriodListPage(ctx, tc.p)
			requireInvalid(t, err, tc.field)
		}
		for _, id := range []string{"ghost", "", "a\x00", "\xff"} {
			_, _, err := b.Ledger.PeriodListPage(ctx, ledger.PeriodListParams{CustomerID: id})
			require.ErrorIs(t, err, ledger.ErrNotFound, "%q", id)
		}
	})

	t.Run("PagesNewestFirst", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		for m := time.June; m <= time.November; m++ {
			b.Clock.Set(time.Date(2026, m, 10, 0, 0, 0, 0, time.UTC))
			_, err := b.Ledger.UsageEventRecord(ctx, event(m.String(), 1))
			require.NoError(t, err)
		}
		// A change of cadence: day 2026-11-01 starts with month 2026-11.
		b.Clock.Set(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
		daily, err := ledger.New(b.Pool, ledger.Config{Cadence: ledger.CadenceDay, Clock: b.Clock.Now, Scheduler: jobs.Scheduler{Client: b.River}})
		require.NoError(t, err)
		_, err = daily.UsageEventRecord(ctx, event("daily", 1))
		require.NoError(t, err)

		all, more, err := b.Ledger.PeriodListPage(ctx, ledger.PeriodListParams{CustomerID: "acme"})
		require.NoError(t, err)
		require.False(t, more)
		want := []string{"2026-11-01", "2026-11", "2026-10", "2026-09", "2026-08", "2026-07", "2026-06"}
		require.ElementsMatch(t, want, labels(all))
		require.Equal(t, "2026-06", all[len(all)-1].Period)

		// Every page size walks the same list, each period once.
		for limit := 1; limit <= len(all)+1; limit++ {
			var walked []string
			cursor := ""
			for pages := 0; ; pages++ {
				require.Less(t, pages, 10)
				page, more, err := b.Ledger.PeriodListPage(ctx, ledger.PeriodListParams{CustomerID: "acme", Limit: limit, StartingAfter: cursor})
				require.NoError(t, err)
				require.LessOrEqual(t, len(page), limit)
				walked = append(walked, labels(page)...)
				if !more {
					break
				}
				cursor = page[len(page)-1].Period
			}
			require.Equal(t, labels(all), walked, "limit %d", limit)
		}

		// PeriodList keeps the same order.
		listed, err := b.Ledger.PeriodList(ctx, "acme")
		require.NoError(t, err)
		require.Equal(t, labels(all), labels(listed))
	})
}

// A malformed period label is refused with an example of the cadence's
// labels, never the Go layout (2006-01-02T15), which reads as a date.
func TestCadenceParseLabel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cadence      ledger.Cadence
		good, bad    string
		wantExample  string
		startsAtHour int
	}{
		{ledger.CadenceMonth, "2026-11", "2026-13", "such as 2026-12", 0},
		{ledger.CadenceDay, "2026-11-30", "2026-11", "such as 2026-12-03", 0},
		{ledger.CadenceHour, "2026-11-30T13", "2026-11-30T1", "such as 2026-12-03T17", 13},
	} {
		b, err := tc.cadence.ParseLabel(tc.good)
		require.NoError(t, err)
		require.Equal(t, tc.good, b.Label)
		require.Equal(t, tc.startsAtHour, b.StartsAt.Hour())

		_, err = tc.cadence.ParseLabel(tc.bad)
		require.ErrorContains(t, err, tc.wantExample)
		require.NotContains(t, err.Error(), "2006")
		require.NotContains(t, err.Error(), "01-02")
	}
}
