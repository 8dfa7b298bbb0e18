package api

import (
	_ "embed"
	"html/template"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/cockroachdb/apd/v3"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
)

// statementResponse is a charge's statement as GET
// /v1/charges/{id}/statement answers it in JSON.
type statementResponse struct {
	Number         int64             `json:"number"`
	IssuedAt       time.Time         `json:"issued_at"`
	ChargeID       int64             `json:"charge_id"`
	CustomerID     string            `json:"customer_id"`
	Period         string            `json:"period"`
	Currency       string            `json:"currency"`
	LineItems      []chargeLine      `json:"line_items"`
	SubtotalCents  int64             `json:"subtotal_cents"`
	CreditsApplied []statementCredit `json:"credits_applied"`
	CreditsCents   int64             `json:"credits_cents"`
	CarriedInCents int64             `json:"carried_in_cents"`
	TotalCents     int64             `json:"total_cents"`
	Status         string            `json:"status"`
	PaymentIntent  *statementPayment `json:"payment_intent"`
	Refunds        []statementRefund `json:"refunds"`
	RefundedCents  int64             `json:"refunded_cents"`
}

type statementCredit struct {
	GrantID     string `json:"grant_id"`
	AmountCents int64  `json:"amount_cents"`
}

type statementPayment struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

type statementRefund struct {
	StripeRefundID string    `json:"stripe_refund_id"`
	Status         string    `json:"status"`
	AmountCents    int64     `json:"amount_cents"`
	CreatedAt      time.Time `json:"created_at"`
}

func newStatementResponse(s *ledger.Statement) statementResponse {
	c := s.Charge
	out := statementResponse{Number: s.Number, IssuedAt: s.IssuedAt, ChargeID: c.ID, CustomerID: c.CustomerID,
		Period: c.Period, Currency: c.Currency, LineItems: []chargeLine{}, CreditsApplied: []statementCredit{},
		CarriedInCents: c.CarriedInCents, TotalCents: c.AmountCents, Status: string(c.Status), Refunds: []statementRefund{}}
	for _, li := range s.Lines {
		if li.Kind == ledger.ChargeLineCredit {
			out.CreditsApplied = append(out.CreditsApplied, statementCredit{GrantID: li.GrantID, AmountCents: -li.AmountCents})
			out.CreditsCents -= li.AmountCents
			continue
		}
		out.LineItems = append(out.LineItems, newChargeLine(li))
		out.SubtotalCents += li.AmountCents
	}
	if c.StripePaymentIntentID != nil {
		out.PaymentIntent = &statementPayment{ID: *c.StripePaymentIntentID, Status: string(c.Status)}
	}
	for _, f := range s.Refunds {
		out.Refunds = append(out.Refunds, statementRefund{StripeRefundID: f.StripeRefundID, Status: f.Status,
			AmountCents: f.AmountCents, CreatedAt: f.StripeCreatedAt})
		if f.Status == "succeeded" {
			out.RefundedCents += f.AmountCents
		}
	}
	return out
}

//go:embed statement.html
var statementHTML string

var statementTemplate = template.Must(template.New("statement").Funcs(template.FuncMap{
	"money": func(currency string, minor int64) string {
		var d apd.Decimal
		d.SetInt64(minor)
		return formatMoney(currency, &d)
	},
	"decimal": func(currency, minor string) string {
		var d apd.Decimal
		if _, _, err := d.SetString(minor); err != nil {
			return minor
		}
		return formatMoney(currency, &d)
	},
	"date":  func(t time.Time) string { return t.UTC().Format("2 January 2006") },
	"neg":   func(n int64) int64 { return -n },
	"deref": func(b *bool) bool { return b != nil && *b },
}).Parse(statementHTML))

// handleChargeStatement returns a settled charge's statement: JSON, or a
// printable HTML page when the request prefers text/html (Accept). 409
// charge_not_settled for a charge not settled yet.
func handleChargeStatement(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r, "charge")
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		s, err := l.ChargeStatement(r.Context(), id)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := newStatementResponse(s)
		if !prefersHTML(r.Header.Get("Accept")) {
			httpjson.Encode(w, http.StatusOK, resp)
			return
		}
		var b strings.Builder
		if err := statementTemplate.Execute(&b, resp); err != nil {
			httpjson.WriteInternal(logger, w, r, err)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(b.String()))
	})
}

// prefersHTML reports whether an Accept header asks for text/html before
// (or instead of) JSON: the first media range of the two it names wins.
func prefersHTML(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil || params["q"] == "0" {
			continue
		}
		switch mt {
		case "text/html":
			return true
		case "application/json", "application/*", "*/*":
			return false
		}
	}
	return false
}

// zeroDecimal are the currencies without minor units (Stripe's list).
var zeroDecimal = map[string]bool{"bif": true, "clp": true, "djf": true, "gnf": true, "jpy": true, "kmf": true, "krw": true,
	"mga": true, "pyg": true, "rwf": true, "ugx": true, "vnd": true, "vuv": true, "xaf": true, "xof": true, "xpf": true}

var currencySymbol = map[string]string{"usd": "$", "eur": "€", "gbp": "£", "jpy": "¥", "cad": "CA$", "aud": "A$"}

// formatMoney shows an amount in minor units (exact, perhaps fractional,
// such as a unit price of 0.5 cents) as money: $15.00, -$3.00, $0.005,
// ¥1500, CHF 12.50.
func formatMoney(currency string, minor *apd.Decimal) string {
	digits := int32(2)
	if zeroDecimal[currency] {
		digits = 0
	}
	var major apd.Decimal
	major.Set(minor)
	major.Exponent -= digits
	neg := major.Negative
	major.Negative = false
	text := pricing.Text(&major) // without trailing zeros: pad to the currency's digits
	if digits > 0 {
		whole, frac, _ := strings.Cut(text, ".")
		text = whole + "." + frac + strings.Repeat("0", max(0, int(digits)-len(frac)))
	}
	sym, ok := currencySymbol[currency]
	if !ok {
		sym = strings.ToUpper(currency) + " "
	}
	if neg {
		return "-" + sym + text
	}
	return sym + text
}
