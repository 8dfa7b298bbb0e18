package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// AllowVariable is the setting that lists the non-public networks webhooks
// may be sent to, named in the errors that refuse an address.
const AllowVariable = "TALLY_WEBHOOKS_ALLOW_CIDRS"

// AddressPolicy decides which addresses a webhook may be sent to: public
// ones, and the non-public ones in Allow. Its zero value allows public
// addresses only.
type AddressPolicy struct {
	// Allow are the non-public networks an operator runs receivers in
	// (TALLY_WEBHOOKS_ALLOW_CIDRS, ParseCIDRs).
	Allow []netip.Prefix
}

// AddressError is an address a webhook may not be sent to, and why.
type AddressError struct {
	Addr netip.Addr

	// Range is the non-public range Addr is in, and What says so ("is in
	// 10.0.0.0/8, a private network (RFC 1918)").
	Range netip.Prefix
	What  string

	// Embedded, when valid, is the IPv4 address Addr embeds (NAT64, 6to4)
	// that is in Range.
	Embedded netip.Addr
}

func (e *AddressError) Error() string {
	why := "it " + e.What
	if e.Embedded.IsValid() {
		why = "it embeds " + e.Embedded.String() + ", which " + e.What
	}
	return fmt.Sprintf("%s is not a public address: %s; webhooks go only to public addresses unless %s allows its network",
		e.Addr, why, AllowVariable)
}

// nonPublicRange is a range of addresses that are not public, and what it
// is.
type nonPublicRange struct {
	prefix netip.Prefix
	what   string
}

// nonPublicV4 are the IPv4 ranges that are not public (IANA's special
// purpose address registry), the narrower before the wider.
var nonPublicV4 = []nonPublicRange{
	{netip.MustParsePrefix("0.0.0.0/8"), `is in 0.0.0.0/8, "this network" (RFC 791; 0.0.0.0 reaches this host)`},
	{netip.MustParsePrefix("10.0.0.0/8"), "is in 10.0.0.0/8, a private network (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "is in 100.64.0.0/10, carrier-grade NAT space (RFC 6598; some clouds serve metadata there)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "is in 127.0.0.0/8, loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "is in 169.254.0.0/16, link-local (where clouds serve their metadata)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "is in 172.16.0.0/12, a private network (RFC 1918)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "is in 192.0.0.0/24, IETF protocol assignments (RFC 6890)"},
	{netip.MustParsePrefix("192.0.2.0/24"), "is in 192.0.2.0/24, documentation (RFC 5737)"},
	{netip.MustParsePrefix("192.88.99.0/24"), "is in 192.88.99.0/24, the former 6to4 relay anycast (RFC 7526)"},
	{netip.MustParsePrefix("192.168.0.0/16"), "is in 192.168.0.0/16, a private network (RFC 1918)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "is in 198.18.0.0/15, benchmarking (RFC 2544)"},
	{netip.MustParsePrefix("198.51.100.0/24"), "is in 198.51.100.0/24, documentation (RFC 5737)"},
	{netip.MustParsePrefix("203.0.113.0/24"), "is in 203.0.113.0/24, documentation (RFC 5737)"},
	{netip.MustParsePrefix("224.0.0.0/4"), "is in 224.0.0.0/4, multicast"},
	{netip.MustParsePrefix("255.255.255.255/32"), "is the broadcast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "is in 240.0.0.0/4, reserved (RFC 1112)"},
}

// nonPublicV6 are the IPv6 ranges that are not public inside global
// unicast (2000::/3), and the best known of those outside it, which are all
// refused.
var nonPublicV6 = []nonPublicRange{
	{netip.MustParsePrefix("::/128"), "is the unspecified address (it reaches this host)"},
	{netip.MustParsePrefix("::1/128"), "is loopback"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "is in 64:ff9b:1::/48, local-use NAT64 (RFC 8215)"},
	{netip.MustParsePrefix("100::/64"), "is in 100::/64, discard-only (RFC 6666)"},
	{netip.MustParsePrefix("2001::/23"), "is in 2001::/23, IETF protocol assignments, Teredo and benchmarking among them (RFC 2928)"},
	{netip.MustParsePrefix("2001:db8::/32"), "is in 2001:db8::/32, documentation (RFC 3849)"},
	{netip.MustParsePrefix("3fff::/20"), "is in 3fff::/20, documentation (RFC 9637)"},
	{netip.MustParsePrefix("fc00::/7"), "is in fc00::/7, unique local (RFC 4193; AWS serves metadata at fd00:ec2::254)"},
	{netip.MustParsePrefix("fe80::/10"), "is in fe80::/10, link-local"},
	{netip.MustParsePrefix("fec0::/10"), "is in fec0::/10, site-local (deprecated)"},
	{netip.MustParsePrefix("ff00::/8"), "is in ff00::/8, multicast"},
}

// Ranges whose addresses embed an IPv4 address, which decides.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052: the last 32 bits
	sixToFour = netip.MustParsePrefix("2002::/16")    // RFC 3056: bits 16 to 48
	globalV6  = netip.MustParsePrefix("2000::/3")
)

// Check returns nil when a webhook may be sent to addr, or an *AddressError
// naming the rule that refuses it. An IPv4-mapped IPv6 address is checked
// as the IPv4 address it is; an IPv6 address embedding an IPv4 one (NAT64
// 64:ff9b::/96, 6to4 2002::/16) as that IPv4 address too; an IPv6 zone is
// ignored.
func (p AddressPolicy) Check(addr netip.Addr) error {
	addr = addr.WithZone("").Unmap()
	if !addr.IsValid() {
		return &AddressError{Addr: addr, What: "is not an IP address"}
	}
	for _, allowed := range p.Allow {
		if allowed.Contains(addr) {
			return nil
		}
	}
	if addr.Is4() {
		for _, r := range nonPublicV4 {
			if r.prefix.Contains(addr) {
				return &AddressError{Addr: addr, Range: r.prefix, What: r.what}
			}
		}
		return nil
	}
	var embedded netip.Addr
	b := addr.As16()
	switch {
	case nat64.Contains(addr):
		embedded = netip.AddrFrom4([4]byte(b[12:16]))
	case sixToFour.Contains(addr):
		embedded = netip.AddrFrom4([4]byte(b[2:6]))
	}
	if embedded.IsValid() {
		var e *AddressError
		if errors.As(p.Check(embedded), &e) {
			return &AddressError{Addr: addr, Range: e.Range, What: e.What, Embedded: embedded}
		}
		return nil
	}
	for _, r := range nonPublicV6 {
		if r.prefix.Contains(addr) {
			return &AddressError{Addr: addr, Range: r.prefix, What: r.what}
		}
	}
	if !globalV6.Contains(addr) {
		return &AddressError{Addr: addr, Range: globalV6, What: "is outside 2000::/3, IPv6's global unicast"}
	}
	return nil
}

// AllowsLoopback reports whether p allows host, a host name or address,
// as a loopback host: localhost (or a name under it) when p allows
// 127.0.0.1, or an allowed loopback address.
func (p AddressPolicy) AllowsLoopback(host string) bool {
	if isLocalhost(host) {
		host = "127.0.0.1"
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	addr = addr.WithZone("").Unmap()
	return addr.IsLoopback() && p.Check(addr) == nil
}

// LoopbackNetworks are 127.0.0.0/8 and ::1/128, the networks a development
// setup allows to send webhooks to a receiver on its own host.
func LoopbackNetworks() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
}

// ParseCIDRs parses a comma-separated list of networks in CIDR notation,
// such as "10.0.0.0/8,fd00::/8" (TALLY_WEBHOOKS_ALLOW_CIDRS); spaces and
// empty entries are ignored. The error names the entry that is not a
// network: not CIDR notation, host bits set, or an IPv4-mapped IPv6 prefix.
func ParseCIDRs(s string) ([]netip.Prefix, error) {
	var list []netip.Prefix
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		p, err := netip.ParsePrefix(entry)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%q is not a network in CIDR notation, such as 10.0.0.0/8, 10.1.2.3/32 or fd00::/8", entry)
		case p != p.Masked():
			return nil, fmt.Errorf("%q has bits set past its /%d; the network is %s", entry, p.Bits(), p.Masked())
		case p.Addr().Is4In6():
			return nil, fmt.Errorf("%q is an IPv4-mapped IPv6 network; write IPv4 networks as such, like 10.0.0.0/8", entry)
		}
		list = append(list, p)
	}
	return list, nil
}

// Resolver looks up the addresses of a host name; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// LookupHost returns the addresses host stands for: itself when it is an IP
// address; 127.0.0.1 and ::1 for localhost and the names under it (RFC
// 6761), which never leave the host; r's answer otherwise.
func LookupHost(ctx context.Context, r Resolver, host string) ([]netip.Addr, error) {
	if addr, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{addr}, nil
	}
	if isLocalhost(host) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}, nil
	}
	return r.LookupNetIP(ctx, "ip", host)
}

func isLocalhost(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	return host == "localhost" || strings.HasSuffix(host, ".localhost")
}
