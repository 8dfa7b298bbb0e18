package api

import "github.com/cockroachdb/apd/v3"

// FormatMoney is formatMoney for a decimal written as a string, for tests.
func FormatMoney(currency, minor string) string {
	var d apd.Decimal
	if _, _, err := d.SetString(minor); err != nil {
		panic(err)
	}
	return formatMoney(currency, &d)
}
