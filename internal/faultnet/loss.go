package faultnet

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
)

// lossTables numbers the loss tables of this process, so that two losses
// between the same hosts are two tables.
var lossTables atomic.Int64

// A Loss drops a random share of the packets between two hosts, each
// direction on its own, until Heal: packet loss without tc netem
// (NetemSupported), by an nftables table in the bridge's namespace that
// drops, as the bridge forwards them, the packets from either host to the
// other, each with the same probability (nftables' numgen random, so the
// losses are independent, not bursts). Neither host sees a drop (a drop
// at a host's own output hook would fail the send with EPERM, which TCP
// takes for a local error, not a loss). TCP between the two hosts
// retransmits what is dropped; Linux's least retransmission timeout is
// 200 ms, so a lost segment that no later one reveals (the last of a
// request) delays its call by that.
type Loss struct {
	n     *Net
	table string
	once  sync.Once
}

// LossCounts is what a Loss's table has counted since it was made: the
// packets from the first host to the second (AB) and from the second to
// the first (BA) the bridge forwarded or dropped, and how many of each
// it dropped.
type LossCounts struct {
	AB, ABDropped uint64
	BA, BADropped uint64
}

// Dropped is the share of all the packets counted that were dropped.
func (c LossCounts) Dropped() float64 {
	if c.AB+c.BA == 0 {
		return 0
	}
	return float64(c.ABDropped+c.BADropped) / float64(c.AB+c.BA)
}

// Loss drops percent (0 to 100, in steps of 0.01) of the packets between
// a and b, each way, until the Loss is healed or the test ends.
func (n *Net) Loss(a, b *Host, percent float64) *Loss {
	n.t.Helper()
	if percent < 0 || percent > 100 {
		n.t.Fatalf("faultnet: loss of %v%%", percent)
	}
	l := &Loss{n: n, table: fmt.Sprintf("faultnet_loss_%d", lossTables.Add(1))}
	// numgen random mod 10000 is uniform on 0…9999: below the percent in
	// hundredths drops that share. The first counter of each rule sees
	// every packet of its direction, the second the dropped ones.
	below := int(percent*100 + 0.5)
	n.must(nft(n.bridge, fmt.Sprintf(`table bridge %[1]s {
	chain between { type filter hook forward priority 0; policy accept;
		ip saddr %[2]s ip daddr %[3]s counter numgen random mod 10000 < %[4]d counter drop
		ip saddr %[3]s ip daddr %[2]s counter numgen random mod 10000 < %[4]d counter drop
	}
}
`, l.table, a.IP(), b.IP(), below)))
	return l
}

// Heal removes the loss; later calls do nothing.
func (l *Loss) Heal() {
	l.n.t.Helper()
	l.once.Do(func() { l.n.must(nft(l.n.bridge, "delete table bridge "+l.table+"\n")) })
}

// Counts reads the table's counters; it must be called before Heal.
func (l *Loss) Counts() LossCounts {
	t := l.n.t
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", l.n.bridge, "nft", "-j", "list", "table", "bridge", l.table).Output()
	if err != nil {
		t.Fatalf("faultnet: nft list table %s: %v", l.table, err)
	}
	var doc struct {
		Nftables []struct {
			Rule *struct {
				Expr []struct {
					Counter *struct {
						Packets uint64 `json:"packets"`
					} `json:"counter"`
				} `json:"expr"`
			} `json:"rule"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("faultnet: nft's JSON: %v", err)
	}
	var counters []uint64 // the rules' in order: a to b, then b to a
	for _, o := range doc.Nftables {
		if o.Rule == nil {
			continue
		}
		for _, e := range o.Rule.Expr {
			if e.Counter != nil {
				counters = append(counters, e.Counter.Packets)
			}
		}
	}
	if len(counters) != 4 {
		t.Fatalf("faultnet: table %s has %d counters, want 4", l.table, len(counters))
	}
	return LossCounts{AB: counters[0], ABDropped: counters[1], BA: counters[2], BADropped: counters[3]}
}

// nft runs an nft script in the namespace ns.
func nft(ns, script string) error {
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %v: %s", ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}
