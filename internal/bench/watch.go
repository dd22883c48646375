package bench

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// watchedRegistry is a stage's registry whose few metrics a benchmark
// polls while the stage runs are also registered in a registry of their
// own (watch): a poll gathers those alone, not every metric of the stage.
// A Gather of a stage's whole registry costs about a millisecond (the
// aggregator with entitlements has three times the series of the one
// without), and at a poll every 20 ms that is CPU time the benchmark
// would charge to the stage it measures. The registry itself (Gather)
// still holds every metric, for the reports made after a run.
type watchedRegistry struct {
	*prometheus.Registry
	watch *prometheus.Registry
	names []string
	seen  map[string]bool // the watched names some collector described
}

// newWatchedRegistry returns a registry whose metrics named names are
// watched.
func newWatchedRegistry(names ...string) *watchedRegistry {
	return &watchedRegistry{Registry: prometheus.NewRegistry(), watch: prometheus.NewRegistry(), names: names, seen: map[string]bool{}}
}

// check reports an error naming the watched metrics that no collector
// registered so far describes: a benchmark would otherwise poll for a
// count that never moves.
func (w *watchedRegistry) check() error {
	var missing []string
	for _, n := range w.names {
		if !w.seen[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("bench: the stage registered no metric %s", strings.Join(missing, ", "))
	}
	return nil
}

// Register registers c, and also in the watch when it describes a watched
// metric.
func (w *watchedRegistry) Register(c prometheus.Collector) error {
	if err := w.Registry.Register(c); err != nil {
		return err
	}
	found := described(c, w.names)
	if len(found) == 0 {
		return nil
	}
	if err := w.watch.Register(c); err != nil {
		w.Registry.Unregister(c)
		return err
	}
	for _, n := range found {
		w.seen[n] = true
	}
	return nil
}

// MustRegister is Register, panicking on an error as prometheus.Registry's
// does.
func (w *watchedRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := w.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister unregisters c from both registries.
func (w *watchedRegistry) Unregister(c prometheus.Collector) bool {
	w.watch.Unregister(c)
	return w.Registry.Unregister(c)
}

// watched gathers the watched metrics alone.
func (w *watchedRegistry) watched() prometheus.Gatherer { return w.watch }

// described returns those of names that c describes. A prometheus.Desc
// has no accessor for its name: its String is `Desc{fqName: "<name>", …}`.
func described(c prometheus.Collector, names []string) []string {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	var found []string
	for d := range ch {
		if name, err := descName(d); err == nil && slices.Contains(names, name) {
			found = append(found, name)
		}
	}
	return found
}

// descName is the name of the metric d describes.
func descName(d *prometheus.Desc) (string, error) {
	const pfx = "Desc{fqName: "
	s, ok := strings.CutPrefix(d.String(), pfx)
	if !ok {
		return "", errors.New("bench: unexpected Desc string " + d.String())
	}
	q, err := strconv.QuotedPrefix(s)
	if err != nil {
		return "", err
	}
	return strconv.Unquote(q)
}
