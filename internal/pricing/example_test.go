package pricing_test

import (
	"fmt"

	"github.com/cockroachdb/apd/v3"

	"github.com/tally-billing/tally/internal/pricing"
)

func Example() {
	plan, err := pricing.ParsePlan([]byte(`{"currency":"USD","prices":{
		"api_calls":{"model":"graduated","tiers":[
			{"up_to":"1000","unit_amount":"0.5"},
			{"up_to":null,"unit_amount":"0.1","flat_amount":"0"}]},
		"storage_gb":{"model":"per_unit","unit_amount":"0.025","minimum_amount":"100"}}}`))
	if err != nil {
		panic(err)
	}
	canonical, _ := plan.MarshalJSON()
	fmt.Println(string(canonical))

	for _, q := range []string{"1500", "1000.5"} {
		quantity, _ := pricing.ParseQuantity(q)
		line, _ := pricing.Rate(plan.Prices["api_calls"], quantity)
		fmt.Println(q, "api_calls:", line.Exact.Text('f'), "→", line.Amount)
	}
	line, _ := pricing.Rate(plan.Prices["storage_gb"], *apd.New(20, 0))
	fmt.Println("20 storage_gb:", line.Subtotal.Text('f'), "minimum applied:", line.MinimumApplied, "→", line.Amount)

	_, err = pricing.ParsePlan([]byte(`{"currency":"usd","prices":{"api_calls":{"model":"graduated","tiers":[
		{"up_to":"1000","unit_amount":"0.5"},{"up_to":"1000","unit_amount":"0.1"},{"up_to":null,"unit_amount":"0"}]}}}`))
	fmt.Println(err)
	// Output:
	// {"currency":"usd","prices":{"api_calls":{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1"}]},"storage_gb":{"model":"per_unit","unit_amount":"0.025","minimum_amount":"100"}}}
	// 1500 api_calls: 550 → 550
	// 1000.5 api_calls: 500.05 → 500
	// 20 storage_gb: 0.5 minimum applied: true → 100
	// invalid plan: prices.api_calls.tiers[1].up_to: must be greater than the previous tier's up_to (1000)
}
