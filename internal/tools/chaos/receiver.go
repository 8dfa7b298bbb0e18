package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/tally-billing/tally/internal/tools/proc"
)

// receiverFailRate is the share of deliveries the run's webhook receiver
// answers 503, at random.
const receiverFailRate = 0.3

// receiver is the producer's webhook endpoint in a run: it verifies each
// delivery's signature with stripe-go (Tally's scheme is Stripe's; the check
// uses no code of Tally's), fails a share of them at random, and records the
// notifications it took.
type receiver struct {
	mu      sync.Mutex
	rnd     *rand.Rand
	secret  string
	tries   int
	failed  int
	refused []string                // why a delivery's signature or body was refused
	got     map[string]notification // by notification id
	dups    int                     // deliveries of a notification already taken
	srv     *http.Server
	url     string
}

// notification is what the check reads of a delivered notification.
type notification struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	Data struct {
		Object struct {
			ID     json.Number `json:"id"`
			Status string      `json:"status"`
			// A top-up's (top_up.*), and the top-up of credit.balance_low.
			CustomerID string `json:"customer_id"`
			TopUpID    string `json:"top_up_id"`
			TopUp      struct {
				CustomerID string `json:"customer_id"`
				TopUpID    string `json:"top_up_id"`
			} `json:"top_up"`
		} `json:"object"`
	} `json:"data"`
}

// startReceiver listens on a loopback port and registers the endpoint for
// every notification type with billingctl.
func startReceiver(ctx context.Context, seed int64, binDir, dbURL string) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{rnd: rand.New(rand.NewPCG(uint64(seed), 14)), got: map[string]notification{}}
	r.url = "http://" + ln.Addr().String() + "/tally"
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	out, err := proc.RunTool(ctx, filepath.Join(binDir, "billingctl"),
		[]string{"DATABASE_URL=" + dbURL, "TALLY_WEBHOOKS_ALLOW_CIDRS=127.0.0.0/8"},
		"webhooks", "create", "--url", r.url, "--events", "*", "--description", "chaos receiver")
	if err != nil {
		r.close()
		return nil, err
	}
	r.secret = regexp.MustCompile(`whsec_[A-Za-z0-9_-]+`).FindString(out)
	if r.secret == "" {
		r.close()
		return nil, fmt.Errorf("billingctl webhooks create printed no secret: %s", out)
	}
	return r, nil
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tries++
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.rnd.Float64() < receiverFailRate {
		r.failed++
		http.Error(w, "try again later", http.StatusServiceUnavailable)
		return
	}
	if err := webhook.ValidatePayloadWithTolerance(body, req.Header.Get("Tally-Signature"), r.secret, 5*time.Minute); err != nil {
		r.refused = append(r.refused, err.Error())
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var n notification
	if err := json.Unmarshal(body, &n); err != nil || n.ID == "" {
		r.refused = append(r.refused, fmt.Sprintf("body %.200s: %v", body, err))
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	if _, dup := r.got[n.ID]; dup {
		r.dups++
	}
	r.got[n.ID] = n
	_, _ = io.WriteString(w, "ok")
}

// snapshot returns what the receiver took, and the refusals.
func (r *receiver) snapshot() (map[string]notification, []string, int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := make(map[string]notification, len(r.got))
	for id, n := range r.got {
		got[id] = n
	}
	return got, append([]string(nil), r.refused...), r.tries, r.failed
}

func (r *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}
