package ledger

import (
	"sync"
	"time"
)

// APIKeyCacheTTLDefault is how long a replica trusts what it read of an API
// key secret before reading it from Postgres again, when
// Config.APIKeyCacheTTL is zero: a live key is trusted, and an unknown or
// revoked secret refused, without a query. A key revoked elsewhere
// (billingctl, another replica) stops working on every replica within this
// time; one revoked through this Ledger stops at once.
const APIKeyCacheTTLDefault = 5 * time.Second

// apiKeyUnknownMax bounds how many unknown (or revoked) secrets a replica
// remembers, by their SHA-256: a flood of distinct bad secrets costs a query
// each and at most this many entries (about 500 KiB), the oldest forgotten
// first.
const apiKeyUnknownMax = 4096

// apiKeyCache holds, by the SHA-256 of their secret, the live keys a replica
// authenticated recently, and the secrets it found unknown or revoked. Live
// keys are bounded by the number of keys in use, unknown secrets by
// apiKeyUnknownMax.
type apiKeyCache struct {
	mu      sync.Mutex
	entries map[[32]byte]apiKeyCacheEntry

	// unknown holds when each unknown secret's entry expires; unknownOrder
	// holds them in the order they were added, a ring of at most
	// apiKeyUnknownMax whose oldest slot is unknownNext once it is full
	// (a secret forgotten and added again may hold two slots), so unknown
	// never holds more than apiKeyUnknownMax.
	unknown      map[[32]byte]time.Time
	unknownOrder [][32]byte
	unknownNext  int
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

// isUnknown reports whether hash was found unknown or revoked, and the
// entry has not expired at now.
func (c *apiKeyCache) isUnknown(hash [32]byte, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	expires, ok := c.unknown[hash]
	return ok && now.Before(expires)
}

// putUnknown remembers hash as unknown until now + ttl. When
// apiKeyUnknownMax secrets are remembered already, it forgets the oldest.
func (c *apiKeyCache) putUnknown(hash [32]byte, now time.Time, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unknown == nil {
		c.unknown = map[[32]byte]time.Time{}
	}
	if _, ok := c.unknown[hash]; !ok {
		if len(c.unknownOrder) < apiKeyUnknownMax {
			c.unknownOrder = append(c.unknownOrder, hash)
		} else {
			// The oldest slot's secret may be gone already (forgetUnknown)
			// or added again since: forgetting it early costs one query.
			delete(c.unknown, c.unknownOrder[c.unknownNext])
			c.unknownOrder[c.unknownNext] = hash
			c.unknownNext = (c.unknownNext + 1) % apiKeyUnknownMax
		}
	}
	c.unknown[hash] = now.Add(ttl)
}

// forgetUnknown drops hash from the unknown secrets: its key was just
// created.
func (c *apiKeyCache) forgetUnknown(hash [32]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.unknown, hash)
}
