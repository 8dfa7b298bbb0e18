// Package jobs holds Tally's River job kinds — args and workers, one file per
// kind — and the River client setup that every process shares (schema river,
// queue names, timeouts). Workers call internal/ledger for every step; the
// ledger never imports this package.
package jobs
