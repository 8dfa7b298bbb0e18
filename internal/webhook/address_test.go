package webhook_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/webhook"
)

func TestAddressPolicy(t *testing.T) {
	t.Parallel()

	t.Run("AllowedNetworks", func(t *testing.T) {
		t.Parallel()
		p := webhook.AddressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd12::/16")}}
		for _, addr := range []string{"10.20.3.4", "::ffff:10.20.3.4", "64:ff9b::a14:304", "fd12::5"} {
			require.NoError(t, p.Check(netip.MustParseAddr(addr)), addr)
		}
		for _, addr := range []string{"10.21.0.1", "fd13::5", "127.0.0.1"} {
			require.Error(t, p.Check(netip.MustParseAddr(addr)), addr)
		}
	})

	t.Run("Loopback", func(t *testing.T) {
		t.Parallel()
		dev := webhook.AddressPolicy{Allow: webhook.LoopbackNetworks()}
		for _, host := range []string{"localhost", "LOCALHOST.", "api.localhost", "127.0.0.1", "127.9.9.9", "::1"} {
			require.True(t, dev.AllowsLoopback(host), host)
			require.False(t, webhook.AddressPolicy{}.AllowsLoopback(host), host)
		}
		for _, host := range []string{"example.com", "10.0.0.1", "0.0.0.0", "::", "localhost.example.com"} {
			require.False(t, dev.AllowsLoopback(host), host)
		}
	})

	t.Run("NamesTheRule", func(t *testing.T) {
		t.Parallel()
		var e *webhook.AddressError
		require.ErrorAs(t, webhook.AddressPolicy{}.Check(netip.MustParseAddr("64:ff9b::a9fe:a9fe")), &e)
		require.Equal(t, "64:ff9b::a9fe:a9fe is not a public address: it embeds 169.254.169.254, which is in 169.254.0.0/16, "+
			"link-local (where clouds serve their metadata); webhooks go only to public addresses unless TALLY_WEBHOOKS_ALLOW_CIDRS allows its network",
			e.Error())
		require.ErrorAs(t, webhook.AddressPolicy{}.Check(netip.MustParseAddr("192.168.1.1")), &e)
		require.Equal(t, netip.MustParsePrefix("192.168.0.0/16"), e.Range)
		require.Contains(t, e.Error(), "it is in 192.168.0.0/16, a private network (RFC 1918)")
	})

	t.Run("NonPublicRefused", func(t *testing.T) {
		t.Parallel()
		for _, addr := range []string{
			"0.0.0.0", "0.1.2.3", "10.0.0.1", "10.255.255.255", "100.64.0.1", "100.100.100.200", "100.127.255.255",
			"127.0.0.1", "127.255.255.254", "169.254.169.254", "172.16.0.1", "172.31.255.255", "192.0.0.192",
			"192.0.2.1", "192.88.99.1", "192.168.0.1", "198.18.0.1", "198.19.255.255", "198.51.100.7", "203.0.113.9",
			"224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
			"::", "::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::a9fe:a9fe", // IPv4-compatible (deprecated)
			"64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b:1::5db8:d70e",
			"2002:a9fe:a9fe::1", "2002:c0a8:101::1", "2002:7f00:1::",
			"100::1", "2001::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:2::1", "2001:db8::1", "3fff::1",
			"fc00::1", "fd00:ec2::254", "fe80::1", "fe80::1%eth0", "fec0::1", "ff02::1", "5f00::1", "4000::1",
		} {
			err := webhook.AddressPolicy{}.Check(netip.MustParseAddr(addr))
			var e *webhook.AddressError
			require.True(t, errors.As(err, &e), "%s: %v", addr, err)
		}
	})

	t.Run("PublicAllowed", func(t *testing.T) {
		t.Parallel()
		for _, addr := range []string{
			"93.184.215.14", "1.1.1.1", "8.8.8.8", "100.63.255.255", "100.128.0.0", "172.15.255.255", "172.32.0.0",
			"192.167.255.255", "198.17.255.255", "198.20.0.0", "223.255.255.255",
			"2606:2800:21f:cb07:6820:80da:af6b:8b2c", "2a00:1450:4001:80b::200e",
			"64:ff9b::5db8:d70e", // NAT64 of 93.184.215.14
			"2002:5db8:d70e::1",  // 6to4 of 93.184.215.14
			"::ffff:93.184.215.14",
		} {
			require.NoError(t, webhook.AddressPolicy{}.Check(netip.MustParseAddr(addr)), addr)
		}
	})
}

func TestParseCIDRs(t *testing.T) {
	t.Parallel()
	list, err := webhook.ParseCIDRs(" 10.0.0.0/8, ,fd00::/8,10.1.2.3/32 ")
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8"),
		netip.MustParsePrefix("10.1.2.3/32")}, list)
	list, err = webhook.ParseCIDRs("")
	require.NoError(t, err)
	require.Empty(t, list)
	for entry, want := range map[string]string{
		"10.0.0.1":              `"10.0.0.1" is not a network in CIDR notation`,
		"10.0.0.0/33":           `"10.0.0.0/33" is not a network in CIDR notation`,
		"intranet":              `"intranet" is not a network in CIDR notation`,
		"192.168.1.1/16":        `"192.168.1.1/16" has bits set past its /16; the network is 192.168.0.0/16`,
		"::ffff:10.0.0.0/104":   `"::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 network`,
		"10.0.0.0/8,fd00::/99x": `"fd00::/99x" is not a network in CIDR notation`,
	} {
		_, err := webhook.ParseCIDRs(entry)
		require.ErrorContains(t, err, want, entry)
	}
}

// failingResolver fails every lookup: LookupHost must not ask it.
type failingResolver struct{}

func (failingResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, errors.New("looked up")
}

func TestLookupHost(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	addrs, err := webhook.LookupHost(ctx, failingResolver{}, "10.1.2.3")
	require.NoError(t, err)
	require.Equal(t, []netip.Addr{netip.MustParseAddr("10.1.2.3")}, addrs)
	addrs, err = webhook.LookupHost(ctx, failingResolver{}, "localhost")
	require.NoError(t, err)
	require.Equal(t, []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}, addrs)
	_, err = webhook.LookupHost(ctx, failingResolver{}, "hooks.example.com")
	require.ErrorContains(t, err, "looked up")
}
