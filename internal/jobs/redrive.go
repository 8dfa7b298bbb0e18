package jobs

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// RedriveParams choose which discarded jobs Redrive retries. Zero fields
// match everything.
type RedriveParams struct {
	// Kinds limits the job kinds; default charge_period, stripe_event and top_up.
	Kinds []string

	// CustomerID and Period limit charge_period jobs by their args.
	CustomerID string
	Period     string

	// JobID selects one job.
	JobID int64

	// DryRun lists what would be retried without retrying it.
	DryRun bool
}

// RedriveItem is one job Redrive retried (or would retry).
type RedriveItem struct {
	JobID    int64
	Kind     string
	Args     string
	Attempts int
	Error    string // the job's last error
}

// Redrive makes discarded charge_period and stripe_event jobs available
// again and returns them. It is safe at any time and any number of times: a
// retried job finds its charge or event's state in the ledger and does only
// what is left (past the Stripe key window, a charge reconciles before any new
// call), and a job that is no longer discarded is not touched.
func Redrive(ctx context.Context, client *river.Client[pgx.Tx], p RedriveParams) ([]RedriveItem, error) {
	kinds := p.Kinds
	if len(kinds) == 0 {
		kinds = []string{ChargePeriodArgs{}.Kind(), StripeEventArgs{}.Kind(), TopUpArgs{}.Kind()}
	}
	params := river.NewJobListParams().Kinds(kinds...).States(rivertype.JobStateDiscarded).First(500)
	if p.JobID != 0 {
		params = params.IDs(p.JobID)
	}
	var items []RedriveItem
	for {
		res, err := client.JobList(ctx, params)
		if err != nil {
			return items, fmt.Errorf("error listing discarded jobs: %w", err)
		}
		for _, job := range res.Jobs {
			if !redriveMatches(job, p) {
				continue
			}
			item := RedriveItem{JobID: job.ID, Kind: job.Kind, Args: string(job.EncodedArgs), Attempts: job.Attempt}
			if n := len(job.Errors); n > 0 {
				item.Error = job.Errors[n-1].Error
			}
			if !p.DryRun {
				if _, err := client.JobRetry(ctx, job.ID); err != nil {
					return items, fmt.Errorf("error retrying job %d: %w", job.ID, err)
				}
			}
			items = append(items, item)
		}
		if len(res.Jobs) < 500 {
			return items, nil
		}
		params = params.After(res.LastCursor)
	}
}

func redriveMatches(job *rivertype.JobRow, p RedriveParams) bool {
	if p.CustomerID == "" && p.Period == "" {
		return true
	}
	if job.Kind == (TopUpArgs{}).Kind() {
		var args TopUpArgs
		if err := json.Unmarshal(job.EncodedArgs, &args); err != nil {
			return false
		}
		return p.Period == "" && args.CustomerID == p.CustomerID
	}
	if job.Kind != (ChargePeriodArgs{}).Kind() {
		return false
	}
	var args ChargePeriodArgs
	if err := json.Unmarshal(job.EncodedArgs, &args); err != nil {
		return false
	}
	return (p.CustomerID == "" || args.CustomerID == p.CustomerID) && (p.Period == "" || args.Period == p.Period)
}
