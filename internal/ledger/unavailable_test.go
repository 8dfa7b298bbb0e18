package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

func TestUnavailable(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"admin shutdown":            {&pgconn.PgError{Code: "57P01"}, true},
		"crash shutdown":            {&pgconn.PgError{Code: "57P02"}, true},
		"starting up":               {&pgconn.PgError{Code: "57P03"}, true},
		"too many connections":      {&pgconn.PgError{Code: "53300"}, true},
		"standby refuses writes":    {&pgconn.PgError{Code: "25006"}, true},
		"pooler cannot log in":      {&pgconn.PgError{Code: "08P01", Message: "server login has been failing, try again later (server_login_retry)"}, true},
		"connection failure":        {&pgconn.PgError{Code: "08006"}, true},
		"wrapped":                   {fmt.Errorf("error closing period: %w", &pgconn.PgError{Code: "57P01"}), true},
		"refused":                   {&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		"cut mid-answer":            {fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), true},
		"no answer in time":         {fmt.Errorf("group: %w", context.DeadlineExceeded), true},
		"connection already closed": {fmt.Errorf("error voiding event: %w", pgconn.ErrConnClosed), true},
		"unique violation":          {&pgconn.PgError{Code: "23505"}, false},
		"deadlock":                  {&pgconn.PgError{Code: "40P01"}, false},
		"check violation":           {&pgconn.PgError{Code: "23514"}, false},
		"a bug":                     {errors.New("inserted x/y, which the statement was not given"), false},
		"nil":                       {nil, false},
		"canceled by its requester": {context.Canceled, false},
	} {
		require.Equal(t, tc.want, ledger.Unavailable(tc.err), name)
	}
}
