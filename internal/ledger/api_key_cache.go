package ledger

import (
	"sync"
	"time"
)

// APIKeyCacheTTLDefault is how long a replica trusts an API key it has
// authenticated before reading it from Postgres again, when
// Config.APIKeyCacheTTL is zero. A key revoked elsewhere (billingctl, another
// replica) stops working on every replica within this time; one revoked
// through this Ledger stops at once.
const APIKeyCacheTTLDefault = 5 * time.Second

// apiKeyCache holds the live keys a replica authenticated recently, by the
// SHA-256 of their secret. Only live keys are cached, so its size is bounded
// by the number of keys in use; an unknown or revoked secret always costs a
// read.
type apiKeyCache struct {
	mu      sync.Mutex
	entries map[[32]byte]apiKeyCacheEntry
}

type apiKeyCacheEntry struct {
	key     APIKey
	expires time.Time
}

// get returns the cached key of hash, if cached and not expired at now.
func (c *apiKeyCache) get(hash [32]byte, now time.Time) (*APIKey, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[hash]
	if !ok || !now.Before(e.expires) {
		return nil, false
	}
	key := e.key
	return &key, true
}

// put caches key under hash until now + ttl, dropping expired entries when
// the map has grown.
func (c *apiKeyCache) put(hash [32]byte, key *APIKey, now time.Time, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[[32]byte]apiKeyCacheEntry{}
	}
	if len(c.entries) >= 1024 {
		for h, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, h)
			}
		}
	}
	c.entries[hash] = apiKeyCacheEntry{key: *key, expires: now.Add(ttl)}
}

// forget drops every cached entry of the key with id.
func (c *apiKeyCache) forget(id int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for h, e := range c.entries {
		if e.key.ID == id {
			delete(c.entries, h)
		}
	}
}
