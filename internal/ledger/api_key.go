package ledger

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Scope is a permission an API key carries.
type Scope string

// Scopes.
const (
	ScopeUsageWrite     Scope = "usage:write"     // post usage events
	ScopeCustomersWrite Scope = "customers:write" // create and update customers
	ScopeBillingRead    Scope = "billing:read"    // read customers, periods and charges
	ScopeAdmin          Scope = "admin"           // close periods, approve and cancel charges
)

// Scopes lists every scope, in the order they are documented.
var Scopes = []Scope{ScopeUsageWrite, ScopeCustomersWrite, ScopeBillingRead, ScopeAdmin}

// ParseScopes parses a comma-separated scope list, or returns an error naming
// the unknown scope and the valid ones.
func ParseScopes(s string) ([]Scope, error) {
	var scopes []Scope
	for _, part := range strings.Split(s, ",") {
		sc := Scope(strings.TrimSpace(part))
		if sc == "" {
			continue
		}
		if !slices.Contains(Scopes, sc) {
			return nil, fmt.Errorf("unknown scope %q: want one or more of %v", sc, Scopes)
		}
		if !slices.Contains(scopes, sc) {
			scopes = append(scopes, sc)
		}
	}
	if len(scopes) == 0 {
		return nil, fmt.Errorf("at least one scope is required: want one or more of %v", Scopes)
	}
	return scopes, nil
}

// APIKey is a stored API key. Its secret is never stored, only its SHA-256.
type APIKey struct {
	ID         int64
	Name       string
	Prefix     string // the secret's first characters, for telling keys apart
	Scopes     []Scope
	CreatedAt  time.Time
	RevokedAt  *time.Time
	LastUsedAt *time.Time
}

// Has reports whether the key carries scope.
func (k *APIKey) Has(scope Scope) bool { return slices.Contains(k.Scopes, scope) }

// apiKeyLastUsedResolution is how stale last_used_at may get before a request
// with the key updates it; it spares a write per request.
const apiKeyLastUsedResolution = time.Minute

const apiKeyColumns = `id, name, key_prefix, scopes, created_at, revoked_at, last_used_at`

func scanAPIKey(row pgx.Row) (*APIKey, error) {
	var k APIKey
	var scopes []string
	if err := row.Scan(&k.ID, &k.Name, &k.Prefix, &scopes, &k.CreatedAt, &k.RevokedAt, &k.LastUsedAt); err != nil {
		return nil, err
	}
	for _, s := range scopes {
		k.Scopes = append(k.Scopes, Scope(s))
	}
	return &k, nil
}

func hashSecret(secret string) []byte {
	sum := sha256.Sum256([]byte(secret))
	return sum[:]
}

// APIKeyCreate creates a key named name with scopes and returns its secret,
// which is shown this once and never stored. Secrets look like
// tly_<10 hex>_<43 base64url>; the first part is the key's prefix.
func (l *Ledger) APIKeyCreate(ctx context.Context, name string, scopes []Scope) (string, *APIKey, error) {
	fe := fieldErrors{}
	checkID(fe, "name", name, true)
	if len(scopes) == 0 {
		fe.add("scopes", "at least one scope is required")
	}
	if err := fe.err(); err != nil {
		return "", nil, err
	}
	prefixBytes := make([]byte, 5)
	secretBytes := make([]byte, 32)
	if _, err := rand.Read(prefixBytes); err != nil {
		return "", nil, err
	}
	if _, err := rand.Read(secretBytes); err != nil {
		return "", nil, err
	}
	prefix := "tly_" + hex.EncodeToString(prefixBytes)
	secret := prefix + "_" + base64.RawURLEncoding.EncodeToString(secretBytes)
	key, err := l.apiKeyInsert(ctx, name, scopes, prefix, secret)
	if err != nil {
		return "", nil, err
	}
	return secret, key, nil
}

// apiKeyInsert stores the key name with scopes, prefix and secret, and drops
// the secret from this Ledger's unknown secrets (a secret is random and new,
// so only one sent before its key existed can be there). Other replicas may
// refuse such a secret for up to Config.APIKeyCacheTTL.
func (l *Ledger) apiKeyInsert(ctx context.Context, name string, scopes []Scope, prefix, secret string) (*APIKey, error) {
	strScopes := make([]string, len(scopes))
	for i, s := range scopes {
		strScopes[i] = string(s)
	}
	key, err := scanAPIKey(l.pool.QueryRow(ctx, `
INSERT INTO billing.api_keys (name, key_prefix, secret_sha256, scopes, created_at)
VALUES ($1, $2, $3, $4, $5)
RETURNING `+apiKeyColumns, name, prefix, hashSecret(secret), strScopes, l.now()))
	if err != nil {
		return nil, fmt.Errorf("error creating API key %q: %w", name, err)
	}
	l.apiKeys.forgetUnknown(sha256.Sum256([]byte(secret)))
	return key, nil
}

// APIKeyAuthenticate returns the live key whose secret is secret, or
// ErrUnauthenticated. What it reads is trusted for Config.APIKeyCacheTTL
// without reading Postgres again: a key found live (so a key revoked by
// another process keeps working that long), and a secret found unknown or
// revoked (so a flood of one bad secret costs one query per TTL; at most
// apiKeyUnknownMax such secrets are remembered). It refreshes the key's
// last_used_at at most once per minute.
func (l *Ledger) APIKeyAuthenticate(ctx context.Context, secret string) (*APIKey, error) {
	if !strings.HasPrefix(secret, "tly_") {
		return nil, ErrUnauthenticated
	}
	hash := sha256.Sum256([]byte(secret))
	now := l.now()
	if key, ok := l.apiKeys.get(hash, now); ok {
		return key, nil
	}
	if l.apiKeys.isUnknown(hash, now) {
		return nil, ErrUnauthenticated
	}
	key, err := scanAPIKey(l.pool.QueryRow(ctx, `
SELECT `+apiKeyColumns+` FROM billing.api_keys
WHERE secret_sha256 = $1 AND revoked_at IS NULL`, hash[:]))
	if errors.Is(err, pgx.ErrNoRows) {
		l.apiKeys.putUnknown(hash, now, l.config.APIKeyCacheTTL)
		return nil, ErrUnauthenticated
	}
	if err != nil {
		return nil, fmt.Errorf("error authenticating API key: %w", err)
	}
	if key.LastUsedAt == nil || now.Sub(*key.LastUsedAt) > apiKeyLastUsedResolution {
		if _, err := l.pool.Exec(ctx, `UPDATE billing.api_keys SET last_used_at = $2 WHERE id = $1`, key.ID, now); err != nil {
			// Bookkeeping only: the request goes on.
			l.logger.WarnContext(ctx, "error updating api key last_used_at", "key_prefix", key.Prefix, "error", err)
		}
	}
	l.apiKeys.put(hash, key, now, l.config.APIKeyCacheTTL)
	return key, nil
}

// APIKeyRevoke revokes the key with the given prefix (tly_…) or name. It
// returns ErrNotFound when no live key matches, and an error when a name
// matches several keys.
func (l *Ledger) APIKeyRevoke(ctx context.Context, prefixOrName string) (*APIKey, error) {
	var revoked *APIKey
	err := l.withTx(ctx, func(tx *Tx) error {
		rows, err := tx.Query(ctx, `
UPDATE billing.api_keys SET revoked_at = $2
WHERE (key_prefix = $1 OR name = $1) AND revoked_at IS NULL
RETURNING `+apiKeyColumns, prefixOrName, l.now())
		if err != nil {
			return err
		}
		keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*APIKey, error) { return scanAPIKey(r) })
		if err != nil {
			return err
		}
		switch len(keys) {
		case 0:
			return ErrNotFound
		case 1:
			revoked = keys[0]
			return nil
		}
		return fmt.Errorf("%d live keys are named %q: revoke one by its prefix", len(keys), prefixOrName)
	})
	if err != nil {
		return nil, err
	}
	l.apiKeys.forget(revoked.ID)
	return revoked, nil
}

// APIKeyList returns every key, revoked ones included, oldest first.
func (l *Ledger) APIKeyList(ctx context.Context) ([]*APIKey, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+apiKeyColumns+` FROM billing.api_keys ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("error listing API keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*APIKey, error) { return scanAPIKey(r) })
	if err != nil {
		return nil, fmt.Errorf("error listing API keys: %w", err)
	}
	return keys, nil
}
