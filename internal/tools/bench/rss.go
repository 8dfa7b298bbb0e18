package bench

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// rssSampleEvery is how often a server's resident set size is read.
const rssSampleEvery = 100 * time.Millisecond

// memory is the largest memory use seen of the Tally server processes.
type memory struct {
	mu     sync.Mutex
	maxRSS int64  // the largest VmRSS sampled, bytes
	maxHWM int64  // the largest VmHWM (peak RSS, by the kernel) read before a stop, bytes
	who    string // the process with the largest of either
}

// peak returns the larger of the sampled maximum and the kernel's peak.
func (m *memory) peak() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return max(m.maxRSS, m.maxHWM)
}

func (m *memory) note(name string, rss, hwm int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if max(rss, hwm) > max(m.maxRSS, m.maxHWM) {
		m.who = name
	}
	m.maxRSS = max(m.maxRSS, rss)
	m.maxHWM = max(m.maxHWM, hwm)
}

// watch samples VmRSS of process pid every rssSampleEvery until the returned
// function is called, which reads VmHWM once more and returns when sampling
// has stopped. Call it before the process stops.
func (m *memory) watch(name string, pid int) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(rssSampleEvery)
		defer t.Stop()
		for {
			if st, err := procStatus(pid); err == nil {
				m.note(name, st["VmRSS"], 0)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		if st, err := procStatus(pid); err == nil {
			m.note(name, st["VmRSS"], st["VmHWM"])
		}
	}
}

// procStatus reads the kB fields of /proc/<pid>/status, in bytes.
func procStatus(pid int) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fields := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.HasSuffix(rest, " kB") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(rest, " kB")), 10, 64)
		if err == nil {
			fields[name] = kb * 1024
		}
	}
	return fields, sc.Err()
}
