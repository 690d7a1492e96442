package metrics

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// String summarizes the snapshot in one line with human units, for a progress line or a log:
// what was received, what the consumer acknowledged (and what it holds), the lag in bytes and in
// time, the rates, memory, spill files, and reconnections if there were any. For example:
//
//	received 12.3k txns, 1.21M changes | acked 12.3k, 2 unacked (oldest 1.5s) | lag 4.00 MiB, 3.2s | 850 txn/s, 42.1k changes/s | memory 12.0 MiB, peak 64.0 MiB | spilled 0 B now, 1.50 GiB total
func (s Reading) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "received %s txns, %s changes", fmtCount(float64(s.Stats.TotalTxns)), fmtCount(float64(s.Stats.TotalChanges)))
	fmt.Fprintf(&b, " | acked %s", fmtCount(float64(s.Activity.Acked)))
	if s.Activity.Unacked > 0 {
		fmt.Fprintf(&b, ", %s unacked (oldest %s)", fmtCount(float64(s.Activity.Unacked)), fmtDuration(s.OldestUnackedAge))
	}
	if s.Activity.CaughtUp {
		// Caught up: nothing the server sent waits; the bytes it sent past the last status
		// update (a keepalive's position, say) are not a lag to print beside it.
		b.WriteString(" | caught up")
	} else {
		fmt.Fprintf(&b, " | lag %s, %s", fmtBytes(s.LagBytes), fmtDuration(s.Lag))
	}
	fmt.Fprintf(&b, " | %s txn/s, %s changes/s", fmtCount(s.TxnsPerSecond), fmtCount(s.ChangesPerSecond))
	fmt.Fprintf(&b, " | memory %s, peak %s", fmtBytes(s.Stats.MemoryBytes), fmtBytes(s.Stats.PeakMemoryBytes))
	fmt.Fprintf(&b, " | spilled %s now, %s total", fmtBytes(s.Stats.SpillBytesNow), fmtBytes(s.Stats.SpillBytes))
	if s.Reconnects > 0 {
		fmt.Fprintf(&b, " | reconnects %d", s.Reconnects)
	}
	return b.String()
}

// fmtCount formats a number with three significant digits and a k, M, G or T suffix: 950, 12.3k,
// 1.21M. Below 10, fractions keep one decimal (0.5); whole numbers have none.
func fmtCount(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Sprint(v)
	}
	neg := ""
	if v < 0 {
		neg, v = "-", -v
	}
	const units = " kMGTPE"
	i := 0
	for v >= 999.5 && i < len(units)-1 {
		v /= 1000
		i++
	}
	suffix := strings.TrimSpace(units[i : i+1])
	if i == 0 {
		if v < 10 && v != math.Trunc(v) {
			return neg + trimZero(fmt.Sprintf("%.1f", v))
		}
		return fmt.Sprintf("%s%.0f", neg, v)
	}
	return neg + sig3(v) + suffix
}

// fmtBytes formats a byte count with binary units: 512 B, 1.50 KiB, 64.0 MiB, 1.21 GiB.
func fmtBytes(n int64) string {
	if n < 0 {
		return "-" + fmtBytes(-n)
	}
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	const units = "KMGTPE"
	v := float64(n) / 1024
	i := 0
	for v >= 1023.5 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return sig3(v) + " " + units[i:i+1] + "iB"
}

// fmtDuration formats a duration for people: 0s, 250ms, 3.2s, 4m05s, 2h07m, 3d04h.
func fmtDuration(d time.Duration) string {
	if d < 0 {
		return "-" + fmtDuration(-d)
	}
	switch {
	case d == 0:
		return "0s"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return trimZero(fmt.Sprintf("%.1f", d.Seconds())) + "s"
	case d < time.Hour:
		s := int64(d / time.Second)
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case d < 48*time.Hour:
		m := int64(d / time.Minute)
		return fmt.Sprintf("%dh%02dm", m/60, m%60)
	default:
		h := int64(d / time.Hour)
		return fmt.Sprintf("%dd%02dh", h/24, h%24)
	}
}

// sig3 formats v (1 <= v < 1000) with three significant digits.
func sig3(v float64) string {
	switch {
	case v >= 99.95:
		return fmt.Sprintf("%.0f", v)
	case v >= 9.995:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func trimZero(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}
