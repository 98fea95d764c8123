package quota

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"sync"

	"github.com/VictoriaMetrics/metrics"
)

var (
	mThrottled = [numKinds]*metrics.Counter{
		metrics.NewCounter(`kaas_quota_throttled_total{kind="produce"}`),
		metrics.NewCounter(`kaas_quota_throttled_total{kind="fetch"}`),
		metrics.NewCounter(`kaas_quota_throttled_total{kind="request"}`),
	}
	// mSensorsFull counts measurements that found the sensor table full (maxSensors).
	mSensorsFull = metrics.NewCounter(`kaas_quota_sensors_full_total`)
)

// The per-entity series are snapshot gauges written at scrape time from the live sensors: one
// series per measured quota entity, never one per request.
var (
	managersMu sync.Mutex
	managers   []*Manager
	writerOnce sync.Once
)

// ExportMetrics adds m's sensors to /metrics: kaas_quota_rate (bytes/s, or percent for
// request), kaas_quota_bound and kaas_quota_throttle_ms_total, labelled kind, user, client_id.
func (m *Manager) ExportMetrics() {
	managersMu.Lock()
	managers = append(managers, m)
	managersMu.Unlock()
	writerOnce.Do(func() { metrics.RegisterMetricsWriter(writeSensors) })
}

// Unexport removes m from /metrics (its broker closed).
func (m *Manager) Unexport() {
	managersMu.Lock()
	defer managersMu.Unlock()
	for i, x := range managers {
		if x == m {
			managers = append(managers[:i], managers[i+1:]...)
			return
		}
	}
}

func writeSensors(w io.Writer) {
	managersMu.Lock()
	ms := append([]*Manager(nil), managers...)
	managersMu.Unlock()
	type row struct {
		labels                 string
		rate, bound, throttled float64
	}
	var rows []row
	for _, m := range ms {
		m.sensors.Range(func(key, v any) bool {
			k, s := key.(sensorKey), v.(*sensor)
			s.mu.Lock()
			rate, bound := s.lastRate, s.lastBound
			s.mu.Unlock()
			labels := fmt.Sprintf(`{kind=%q,user=%s,client_id=%s}`, kindName[k.kind], strconv.Quote(k.user), strconv.Quote(k.client))
			rows = append(rows, row{labels, rate, bound, float64(s.throttledMs.Load())})
			return true
		})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].labels < rows[j].labels })
	for _, r := range rows {
		metrics.WriteGaugeFloat64(w, "kaas_quota_rate"+r.labels, r.rate)
		metrics.WriteGaugeFloat64(w, "kaas_quota_bound"+r.labels, r.bound)
		metrics.WriteCounterFloat64(w, "kaas_quota_throttle_ms_total"+r.labels, r.throttled)
	}
}
