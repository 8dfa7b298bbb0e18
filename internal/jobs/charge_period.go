package jobs

import "github.com/riverqueue/river"

// QueueCharges is the queue of charge_period jobs. Pausing it is the kill
// switch for money movement.
const QueueCharges = "charges"

// ChargePeriodArgs are the args of the charge job of one (customer, period).
// The job is unique by both fields: River refuses a second live job for the
// same pair, a second guard behind the period row that inserts it only once.
type ChargePeriodArgs struct {
	CustomerID string `json:"customer_id" river:"unique"`
	Period     string `json:"period" river:"unique"`
}

// Kind is the River job kind, "charge_period".
func (ChargePeriodArgs) Kind() string { return "charge_period" }

// InsertOpts puts charge jobs on QueueCharges, unique by args.
func (ChargePeriodArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:      QueueCharges,
		UniqueOpts: river.UniqueOpts{ByArgs: true},
	}
}
