package ledger

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Unavailable reports whether err is Postgres out of reach rather than a
// fault of the request or of Tally: a connection refused or cut, a server
// shutting down, crashed or starting (57P01–57P03), too many connections
// (53300), a statement past its deadline (a server that stopped answering),
// a connection the driver found closed (its backend terminated), a
// standby that refuses writes (25006: a failover under way, the
// connection on the old primary), or a pooler in front of Postgres that
// cannot reach it (class 08, which PgBouncer uses for "server login has
// been failing" and its other refusals). Nothing was acknowledged, and the
// same request sent again is safe — a write that did commit before the
// connection was cut answers its replay — so the API answers 503 with
// Retry-After rather than 500.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03", "53300", "25006":
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08")
	}
	var connectErr *pgconn.ConnectError
	var netErr *net.OpError
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, context.DeadlineExceeded) // a server that stopped answering (the ingest group's bound)
}
