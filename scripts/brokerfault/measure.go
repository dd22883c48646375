package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// sample polls the stage's /readyz every 250 ms and, on another
// goroutine, its /metrics one scrape after the other: a scrape waits up
// to 5 s for the consumer lag while a broker does not answer.
func (x *experiment) sample(st *stage) {
	go x.scrape(st)
	c := http.Client{Timeout: 2 * time.Second}
	tk := time.NewTicker(250 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-x.stopc:
			return
		case <-tk.C:
		}
		s := sample{at: time.Now()}
		if resp, err := c.Get("http://" + st.addr + "/readyz"); err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
			resp.Body.Close()
			s.ready, s.why = resp.StatusCode == http.StatusOK, strings.TrimSpace(string(b))
		} else {
			s.why = err.Error()
		}
		st.mu.Lock()
		st.ready = append(st.ready, s)
		st.mu.Unlock()
	}
}

// scrape reads the stage's committed transactions and session restarts
// from /metrics until the experiment stops.
func (x *experiment) scrape(st *stage) {
	c := http.Client{Timeout: 15 * time.Second}
	for {
		select {
		case <-x.stopc:
			return
		case <-time.After(250 * time.Millisecond):
		}
		resp, err := c.Get("http://" + st.addr + "/metrics")
		if err != nil {
			continue
		}
		s := sample{at: time.Now()}
		found := false
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 2 || strings.HasPrefix(f[0], "#") {
				continue
			}
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			switch {
			case strings.Contains(f[0], "_transactions_total{") && strings.Contains(f[0], `outcome="committed"`):
				s.committed += v
				found = true
			case strings.Contains(f[0], "_session_restarts_total"):
				s.restarts += v
			}
		}
		resp.Body.Close()
		// The scrape answers when it is done: the time it was taken.
		if found {
			st.mu.Lock()
			st.samples = append(st.samples, s)
			st.mu.Unlock()
		}
	}
}

// committing reports whether the stage committed a transaction after t
// and answered /readyz 200 at its last sample.
func (st *stage) committing(t time.Time) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	base, moved := -1.0, false
	for _, s := range st.samples {
		if s.at.Before(t) {
			continue
		}
		if base < 0 {
			base = s.committed
		} else if s.committed > base {
			moved = true
		}
	}
	n := len(st.ready)
	return moved && n > 0 && st.ready[n-1].ready
}

// result is one stage's account of one fault.
type result struct {
	stall      time.Duration // longest time without a committed transaction, begun while the broker was away
	endedAfter time.Duration // the stall's end, after the fault
	// stallBack is the longest begun after the broker was back, ended
	// backEndedAfter after the fault.
	stallBack, backEndedAfter time.Duration
	readyIn                   time.Duration // of the stall, how long /readyz said 200
	notReady                  time.Duration // from the fault until recovered, /readyz not 200
	restarts                  float64
	reasons                   []string // the /readyz answers other than 200
}

// account measures the stage from t0 to end: the longest gap between
// two scrapes whose committed count differs (the last scrape before t0
// counts as its start) that began before the broker was back, the
// longest that began after, and /readyz meanwhile.
func (st *stage) account(t0, back, end time.Time) result {
	st.mu.Lock()
	defer st.mu.Unlock()
	var r result
	var ss []sample
	for i, s := range st.samples {
		if !s.at.Before(t0) && !s.at.After(end) {
			if len(ss) == 0 && i > 0 {
				ss = append(ss, st.samples[i-1])
			}
			ss = append(ss, s)
		}
	}
	if len(ss) < 2 {
		return r
	}
	last := ss[0]
	var from, to time.Time
	for _, s := range ss[1:] {
		if s.committed != last.committed {
			d := s.at.Sub(last.at)
			switch {
			case last.at.Before(back) && d > r.stall:
				r.stall, r.endedAfter, from, to = d, s.at.Sub(t0), last.at, s.at
			case !last.at.Before(back) && d > r.stallBack:
				r.stallBack, r.backEndedAfter = d, s.at.Sub(t0)
			}
			last = s
		}
	}
	if d := ss[len(ss)-1].at.Sub(last.at); last.at.Before(back) && d > r.stall { // never committed again
		r.stall, r.endedAfter, from, to = d, -1, last.at, ss[len(ss)-1].at
	}
	r.restarts = ss[len(ss)-1].restarts - ss[0].restarts
	why := map[string]bool{}
	for i := 1; i < len(st.ready); i++ {
		s, prev := st.ready[i], st.ready[i-1]
		if s.at.Before(t0) || s.at.After(end) {
			continue
		}
		d := s.at.Sub(prev.at)
		if !s.ready {
			r.notReady += d
			why[s.why] = true
		} else if s.at.After(from) && !s.at.After(to) {
			r.readyIn += d
		}
	}
	for w := range why {
		if len(w) > 110 {
			w = w[:110] + "…"
		}
		r.reasons = append(r.reasons, w)
	}
	sort.Strings(r.reasons)
	return r
}

// warnings counts the stage's warn and error log lines from t0 to end by
// message.
func (st *stage) warnings(t0, end time.Time) map[string]int {
	out := map[string]int{}
	f, err := os.Open(st.logFile)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct{ Level, Msg, Ts, Error string }
		if json.Unmarshal(sc.Bytes(), &l) != nil || (l.Level != "warn" && l.Level != "error") {
			continue
		}
		ts, err := time.Parse("2006-01-02T15:04:05.000Z0700", l.Ts)
		if err != nil || ts.Before(t0) || ts.After(end) {
			continue
		}
		m := l.Msg
		if l.Error != "" {
			e := l.Error
			if len(e) > 90 {
				e = e[:90] + "…"
			}
			m += " [" + e + "]"
		}
		out[m]++
	}
	return out
}

// waitHealthy waits until every partition of the cluster has all its
// replicas in sync and a leader.
func (x *experiment) waitHealthy(d time.Duration) error {
	end := time.Now().Add(d)
	adm := kadm.NewClient(x.cl)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		md, err := adm.Metadata(ctx)
		cancel()
		bad := 0
		if err == nil {
			for _, t := range md.Topics {
				for _, p := range t.Partitions {
					if p.Leader < 0 || len(p.ISR) < len(p.Replicas) {
						bad++
					}
				}
			}
			if len(md.Brokers) < 3 {
				bad++
			}
		}
		if err == nil && bad == 0 {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("cluster not healthy after %s: %v, %d partitions not in sync", d, err, bad)
		}
		time.Sleep(time.Second)
	}
}

// fault hits one target and reports every stage's account.
func (x *experiment) fault(name string) error {
	b, err := x.target(name)
	if err != nil {
		return err
	}
	verb, back := "pause-broker", "resume-broker"
	if x.o.fault == "kill" {
		verb, back = "kill-broker", "start-broker"
	}
	t0 := time.Now()
	if err := x.kafkaSh(verb, strconv.Itoa(int(b))); err != nil {
		return err
	}
	log.Printf("%s: %s broker %d for %s", name, verb, b, x.o.down)
	time.Sleep(x.o.down - time.Since(t0))
	if err := x.kafkaSh(back, strconv.Itoa(int(b))); err != nil {
		return err
	}
	tBack := time.Now()
	log.Printf("%s: broker %d back (%s after the fault)", name, b, tBack.Sub(t0).Round(100*time.Millisecond))
	// Recovered: every stage committed and is ready, 15 s after the
	// broker is back (an unaffected stage commits all along).
	for time.Since(tBack) < x.o.recoverMax {
		ok := time.Since(tBack) > 15*time.Second
		for _, st := range x.stages {
			ok = ok && st.committing(tBack.Add(15*time.Second))
		}
		if ok {
			break
		}
		time.Sleep(time.Second)
	}
	end := time.Now()
	for _, st := range x.stages {
		r := st.account(t0, tBack, end)
		ended := "never"
		if r.endedAfter >= 0 {
			ended = fmt.Sprintf("%.1fs", r.endedAfter.Seconds())
		}
		fmt.Printf("RESULT fault=%s target=%s broker=%d stage=%s stall=%.1fs ended_after=%s ready_during_stall=%.1fs not_ready=%.1fs restarts=%.0f back_at=%.1fs stall_after_back=%.1fs ended_after_back=%.1fs\n",
			x.o.fault, name, b, st.name, r.stall.Seconds(), ended, r.readyIn.Seconds(), r.notReady.Seconds(), r.restarts, tBack.Sub(t0).Seconds(),
			r.stallBack.Seconds(), r.backEndedAfter.Seconds())
		for _, w := range r.reasons {
			fmt.Printf("  %s readyz: %s\n", st.name, w)
		}
		var ws []string
		for m, n := range st.warnings(t0, end) {
			ws = append(ws, fmt.Sprintf("%dx %s", n, m))
		}
		sort.Strings(ws)
		for _, w := range ws {
			fmt.Printf("  %s log: %s\n", st.name, w)
		}
	}
	return nil
}

// run sets up, waits until every stage commits, then hits each target.
func (x *experiment) run(targets []string) error {
	keys, err := x.setup()
	if err != nil {
		return err
	}
	if err := x.start(keys); err != nil {
		return err
	}
	t := time.Now()
	for ok := false; !ok; time.Sleep(time.Second) {
		if time.Since(t) > 3*time.Minute {
			return fmt.Errorf("the stages did not all commit within 3 minutes (logs in %s)", x.o.out)
		}
		ok = true
		for _, st := range x.stages {
			ok = ok && st.committing(t.Add(5*time.Second))
		}
	}
	log.Printf("every stage commits (%s after start); logs in %s", time.Since(t).Round(time.Second), x.o.out)
	for _, name := range targets {
		if err := x.waitHealthy(5 * time.Minute); err != nil {
			return err
		}
		time.Sleep(10 * time.Second) // steady again
		if err := x.fault(name); err != nil {
			return err
		}
	}
	return nil
}
