package api

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/tally-billing/tally/internal/api/httpjson"
)

// handleRiverUIQueuePause passes River UI's pause of queue {name} on to ui,
// unless the queue is one of queues (the queues Tally runs) or "*" (every
// queue): those it refuses, 403 tally_queue, naming the kill switch's
// command. A pause there would stop Tally's work with no record of who or
// why, and the kill switch's state would not say who paused it.
func handleRiverUIQueuePause(queues []string, ui http.Handler) http.Handler {
	return riverUIQueueSet("pause", queues, ui)
}

// handleRiverUIQueueResume is handleRiverUIQueuePause for River UI's resume
// of queue {name}: a resume there would lift the kill switch unrecorded.
func handleRiverUIQueueResume(queues []string, ui http.Handler) http.Handler {
	return riverUIQueueSet("resume", queues, ui)
}

// riverUIQueueSet refuses verb (pause or resume) of queue {name} when Tally
// runs it, and passes it on to ui otherwise.
func riverUIQueueSet(verb string, queues []string, ui http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		which := fmt.Sprintf("queue %q, which Tally runs", name)
		switch {
		case name == "*":
			which = `every queue ("*"), Tally's among them`
		case !slices.Contains(queues, name):
			ui.ServeHTTP(w, r)
			return
		}
		httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusForbidden, Code: "tally_queue",
			Detail: fmt.Sprintf("River UI may not %s %s: Tally pauses and resumes charging only, with "+
				`billingctl charging %s --reason "…" or POST /v1/admin/charging/%s {"reason": "…"}, which record who did it and why`,
				verb, which, verb, verb)})
	})
}
