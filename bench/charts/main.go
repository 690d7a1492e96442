// Command charts reads `go test -bench` output of ./bench and ./heap and draws the SVG charts of
// the benchmark history (bench/results), and prints the targets' measured ratios as a Markdown
// table.
//
// Usage:
//
//	go run ./bench/charts -o bench/results bench/results/*.txt
//
// It writes, into the -o folder, ns-per-change.svg, peak-heap.svg, live.svg,
// eviction-choice.svg, apply-sync.svg and apply-catchup.svg (each only when the input has the
// benchmarks it draws). It uses the standard library only: the SVG is written as text.
//
// With -tables it also prints the result tables: one per offline benchmark family, and for the
// live apply benchmarks (BenchmarkApplySync, BenchmarkApplyCatchup) one row per case with the
// subscribers side by side.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// result is one benchmark line: its name (without the -GOMAXPROCS suffix) and its metrics by unit.
type result struct {
	name    string
	metrics map[string]float64
}

var procSuffix = regexp.MustCompile(`-\d+$`)

// parse reads benchmark lines: "BenchmarkName-2  1  123 ns/op  4.5 ns/change ...".
func parse(r io.Reader) ([]result, error) {
	var out []result
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		res := result{name: procSuffix.ReplaceAllString(f[0], ""), metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("benchmark %s: value %q: %v", f[0], f[i], err)
			}
			res.metrics[f[i+1]] = v
		}
		out = append(out, res)
	}
	return out, sc.Err()
}

// bar is one bar of a horizontal bar chart; mark, if > 0, draws a vertical tick at that value
// (a limit to stay under).
type bar struct {
	label string
	value float64
	color string
	mark  float64
}

// chart draws a horizontal bar chart as SVG.
func chart(title, unit string, bars []bar, logScale bool) string {
	const (
		labelW = 560
		plotW  = 460
		rowH   = 18
		top    = 44
	)
	maxV := 0.0
	minV := math.Inf(1)
	for _, b := range bars {
		maxV = max(maxV, b.value, b.mark)
		if b.value > 0 {
			minV = min(minV, b.value)
		}
	}
	if maxV == 0 {
		maxV = 1
	}
	lo := 0.0
	if logScale {
		lo = math.Floor(math.Log10(minV))
		maxV = math.Ceil(math.Log10(maxV))
	}
	x := func(v float64) float64 {
		if logScale {
			if v <= 0 {
				return 0
			}
			return plotW * (math.Log10(v) - lo) / (maxV - lo)
		}
		return plotW * v / maxV
	}
	h := top + rowH*len(bars) + 30
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", labelW+plotW+90, h)
	fmt.Fprintf(&s, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&s, `<text x="8" y="18" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	scale := "linear scale"
	if logScale {
		scale = "log scale"
	}
	fmt.Fprintf(&s, `<text x="8" y="34" fill="#555">%s, %s</text>`+"\n", html.EscapeString(unit), scale)
	for i, b := range bars {
		y := top + i*rowH
		fmt.Fprintf(&s, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-6, y+13, html.EscapeString(b.label))
		w := x(b.value)
		fmt.Fprintf(&s, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, y+3, w, rowH-5, b.color)
		fmt.Fprintf(&s, `<text x="%.1f" y="%d" fill="#333">%s</text>`+"\n", float64(labelW)+w+4, y+13, human(b.value))
		if b.mark > 0 {
			mx := float64(labelW) + x(b.mark)
			fmt.Fprintf(&s, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#d62728" stroke-width="2"/>`+"\n", mx, y+1, mx, y+rowH-1)
		}
	}
	fmt.Fprintf(&s, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>`+"\n", labelW, top, labelW, top+rowH*len(bars))
	fmt.Fprintf(&s, "</svg>\n")
	return s.String()
}

// human formats a value with 3 significant digits and a k/M/G suffix.
func human(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e9:
		return strconv.FormatFloat(v/1e9, 'g', 3, 64) + "G"
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

const (
	colorPgreorder = "#1f77b4"
	colorNaive     = "#ff7f0e"
	colorOther     = "#7f7f7f"
)

func implColor(name string) string {
	switch {
	case strings.Contains(name, "impl=naive"):
		return colorNaive
	case strings.Contains(name, "impl=pgreorder"):
		return colorPgreorder
	}
	return colorOther
}

const slack = 16 << 20 // the peak heap target: work mem + 16 MiB

func main() {
	outDir := flag.String("o", ".", "folder to write the SVG files to")
	tables := flag.Bool("tables", false, "also print the result table of each benchmark family (Markdown)")
	flag.Parse()
	var all []result
	for _, p := range flag.Args() {
		f, err := os.Open(p)
		if err != nil {
			fatal(err)
		}
		rs, err := parse(f)
		f.Close()
		if err != nil {
			fatal(fmt.Errorf("%s: %v", p, err))
		}
		all = append(all, rs...)
	}
	if len(all) == 0 {
		fatal(fmt.Errorf("no benchmark results in %v", flag.Args()))
	}

	var speed, heap, live, evict, applySync, applyCatchup []bar
	for _, r := range all {
		if c, sub, ok := applyCase(r.name); ok {
			if v, ok := r.metrics["sql-ms"]; ok {
				applySync = append(applySync, bar{label: c + " " + sub, value: v, color: subColor(sub)})
			}
			if v, ok := r.metrics["catchup-s"]; ok {
				applyCatchup = append(applyCatchup, bar{label: c + " " + sub, value: v, color: subColor(sub)})
			}
		}
		label := strings.TrimPrefix(r.name, "Benchmark")
		if v, ok := r.metrics["ns/change"]; ok {
			speed = append(speed, bar{label: label, value: v, color: implColor(r.name)})
		}
		if v, ok := r.metrics["peak-heap-bytes"]; ok && !strings.Contains(r.name, "generator-only") {
			b := bar{label: label, value: v / (1 << 20), color: implColor(r.name)}
			if wm, ok := r.metrics["workmem-bytes"]; ok && !strings.Contains(r.name, "noaccounting") {
				b.mark = (wm + slack) / (1 << 20)
			}
			heap = append(heap, b)
		}
		for unit, v := range r.metrics {
			if strings.HasSuffix(unit, "-commit-to-last-ms") {
				mode := strings.TrimSuffix(unit, "-commit-to-last-ms")
				c := colorOther
				if strings.HasPrefix(mode, "pgreorder") {
					c = colorPgreorder
				} else if strings.HasSuffix(mode, "-on") {
					c = "#2ca02c"
				}
				live = append(live, bar{label: label + " " + mode, value: v, color: c})
			}
		}
		if strings.HasPrefix(r.name, "BenchmarkEvictionChoice") {
			if v, ok := r.metrics["ns/op"]; ok {
				c := colorOther
				if strings.Contains(r.name, "pairing") {
					c = colorPgreorder
				}
				evict = append(evict, bar{label: label, value: v, color: c})
			}
		}
	}
	sort.SliceStable(live, func(i, j int) bool { return live[i].label < live[j].label })
	write := func(name, svg string) {
		p := filepath.Join(*outDir, name)
		if err := os.WriteFile(p, []byte(svg), 0o644); err != nil {
			fatal(err)
		}
		fmt.Fprintln(os.Stderr, "wrote", p)
	}
	if len(speed) > 0 {
		write("ns-per-change.svg", chart("Time per change (lower is better; blue pgreorder, orange naive map of pglogrepl messages)", "ns/change", speed, false))
	}
	if len(heap) > 0 {
		write("peak-heap.svg", chart("Peak Go heap during the run (red tick: work mem + 16 MiB)", "MiB above the baseline, heap objects incl. garbage not yet collected", heap, true))
	}
	if len(live) > 0 {
		write("live.svg", chart("Live: COMMIT of a 1M-row INSERT → last change out (median)", "ms", live, false))
	}
	if len(evict) > 0 {
		write("eviction-choice.svg", chart("Eviction choice: cost per change with N open transactions (blue: pairing heap)", "ns/op", evict, true))
	}
	if len(applySync) > 0 {
		write("apply-sync.svg", chart("Synchronous replication: publisher SQL time of the bulk insert (lower is better; blue pgreorder apply, grey/green PostgreSQL's subscriber)", "ms", applySync, false))
	}
	if len(applyCatchup) > 0 {
		write("apply-catchup.svg", chart("Catch-up of a pgbench backlog: until the slot's confirmed flush passes its end (lower is better)", "s", applyCatchup, false))
	}
	targets(os.Stdout, all)
	if *tables {
		resultTables(os.Stdout, all)
		applyTables(os.Stdout, all)
	}
}

// applyCase splits a live apply benchmark's name into its case and its subscriber:
// "BenchmarkApplySync/pg=18/.../sub=native-on" gives "ApplySync/pg=18/...", "native-on".
func applyCase(name string) (string, string, bool) {
	if !strings.HasPrefix(name, "BenchmarkApply") {
		return "", "", false
	}
	c, sub, ok := strings.Cut(strings.TrimPrefix(name, "Benchmark"), "/sub=")
	return c, sub, ok
}

// subColor colors a subscriber's bars: pgreorder blue, PostgreSQL's grey (off, on) or green
// (parallel).
func subColor(sub string) string {
	switch {
	case strings.HasPrefix(sub, "pgreorder"):
		return colorPgreorder
	case sub == "native-parallel":
		return "#2ca02c"
	case sub == "native-off":
		return "#bbbbbb"
	}
	return colorOther
}

// Columns of the apply tables, in order.
var (
	syncSubs    = []string{"native-parallel", "native-on", "pgreorder-eager", "pgreorder-buffered"}
	catchupSubs = []string{"limit", "native", "pgreorder-buffered", "pgreorder-eager", "pgreorder-parallel-4", "pgreorder-parallel-4-relaxed"}
)

// applyTables prints the live apply results, one row per case, the subscribers side by side.
// A subscriber with no result in the input (not run, failed, skipped) shows "—".
func applyTables(w io.Writer, all []result) {
	type row struct {
		name string
		subs map[string]map[string]float64
	}
	collect := func(prefix string) []*row {
		var rows []*row
		byName := map[string]*row{}
		for _, r := range all {
			c, sub, ok := applyCase(r.name)
			if !ok || !strings.HasPrefix(c, prefix+"/") {
				continue
			}
			rw := byName[c]
			if rw == nil {
				rw = &row{name: strings.TrimPrefix(c, prefix+"/"), subs: map[string]map[string]float64{}}
				byName[c] = rw
				rows = append(rows, rw)
			}
			rw.subs[sub] = r.metrics
		}
		return rows
	}
	get := func(rw *row, sub, unit string) (float64, bool) {
		v, ok := rw.subs[sub][unit]
		return v, ok
	}
	ratio := func(rw *row, unit, num, den string) string {
		a, ok1 := get(rw, num, unit)
		b, ok2 := get(rw, den, unit)
		if !ok1 || !ok2 || b == 0 {
			return "—"
		}
		return strconv.FormatFloat(a/b, 'f', 2, 64)
	}
	if rows := collect("ApplySync"); len(rows) > 0 {
		fmt.Fprintf(w, "\nApplySync (publisher SQL time, ms, median of the rounds):\n\n|case|%s|parallel/on|eager/native-parallel|eager/buffered|\n", strings.Join(syncSubs, "|"))
		fmt.Fprintf(w, "|---|%s|---|---|---|\n", strings.Repeat("---|", len(syncSubs)-1)+"---")
		for _, rw := range rows {
			fmt.Fprintf(w, "| %s |", rw.name)
			for _, sub := range syncSubs {
				if v, ok := get(rw, sub, "sql-ms"); ok {
					fmt.Fprintf(w, " %.0f |", v)
				} else {
					fmt.Fprint(w, " — |")
				}
			}
			fmt.Fprintf(w, " %s | %s | %s |\n", ratio(rw, "sql-ms", "native-parallel", "native-on"),
				ratio(rw, "sql-ms", "pgreorder-eager", "native-parallel"), ratio(rw, "sql-ms", "pgreorder-eager", "pgreorder-buffered"))
		}
	}
	if rows := collect("ApplyCatchup"); len(rows) > 0 {
		fmt.Fprintf(w, "\nApplyCatchup (s until the confirmed flush passed the backlog; × limit, × native: the time over the limit's, over the native worker's):\n\n|case|%s|\n", strings.Join(catchupSubs, "|"))
		fmt.Fprintf(w, "|---|%s|\n", strings.Repeat("---|", len(catchupSubs)-1)+"---")
		for _, rw := range rows {
			fmt.Fprintf(w, "| %s |", rw.name)
			for _, sub := range catchupSubs {
				v, ok := get(rw, sub, "catchup-s")
				if !ok {
					fmt.Fprint(w, " — |")
					continue
				}
				cell := strconv.FormatFloat(v, 'f', 2, 64)
				var rs []string
				if sub != "limit" {
					if r := ratio(rw, "catchup-s", sub, "limit"); r != "—" {
						rs = append(rs, r+"× limit")
					}
				}
				if sub != "limit" && sub != "native" {
					if r := ratio(rw, "catchup-s", sub, "native"); r != "—" {
						rs = append(rs, r+"× native")
					}
				}
				if len(rs) > 0 {
					cell += " (" + strings.Join(rs, ", ") + ")"
				}
				fmt.Fprintf(w, " %s |", cell)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "\nApplyCatchup CPU per source transaction (ms: the subscriber server's, all its processes, + the applier process's; × native):\n\n|case|%s|\n", strings.Join(catchupSubs, "|"))
		fmt.Fprintf(w, "|---|%s|\n", strings.Repeat("---|", len(catchupSubs)-1)+"---")
		for _, rw := range rows {
			fmt.Fprintf(w, "| %s |", rw.name)
			for _, sub := range catchupSubs {
				v, ok := get(rw, sub, "cpu-ms/txn")
				if !ok {
					fmt.Fprint(w, " — |")
					continue
				}
				t, _ := get(rw, sub, "target-cpu-ms/txn")
				a, _ := get(rw, sub, "applier-cpu-ms/txn")
				cell := fmt.Sprintf("%.3f (%.3f + %.3f)", v, t, a)
				if sub != "limit" && sub != "native" {
					if r := ratio(rw, "cpu-ms/txn", sub, "native"); r != "—" {
						cell += ", " + r + "×"
					}
				}
				fmt.Fprintf(w, " %s |", cell)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "\nApplyCatchup peak RSS of the subscriber's own process (MB; the native worker runs inside the server):\n\n|case|%s|\n", strings.Join(catchupSubs, "|"))
		fmt.Fprintf(w, "|---|%s|\n", strings.Repeat("---|", len(catchupSubs)-1)+"---")
		for _, rw := range rows {
			fmt.Fprintf(w, "| %s |", rw.name)
			for _, sub := range catchupSubs {
				if v, ok := get(rw, sub, "applier-rss-MB"); ok {
					fmt.Fprintf(w, " %.0f |", v)
				} else {
					fmt.Fprint(w, " — |")
				}
			}
			fmt.Fprintln(w)
		}
	}
}

// resultTables prints one Markdown table per offline benchmark family, in input order.
func resultTables(w io.Writer, all []result) {
	mib := func(r result, unit string) string {
		v, ok := r.metrics[unit]
		if !ok {
			return "—"
		}
		return strconv.FormatFloat(v/(1<<20), 'f', 1, 64)
	}
	num := func(r result, unit string) string {
		v, ok := r.metrics[unit]
		if !ok {
			return "—"
		}
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
	for _, fam := range []string{"ManySubxacts", "BulkInsert", "SmallTxns", "RollbackToSavepoint"} {
		if !slices.ContainsFunc(all, func(r result) bool {
			return strings.HasPrefix(r.name, "Benchmark"+fam+"/") && r.metrics["ns/change"] != 0
		}) {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n\n", fam)
		fmt.Fprintln(w, "| case | ns/change | allocs/change | B/change | spilled MiB | peak heap MiB | peak live MiB | work mem + 16 MiB |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
		for _, r := range all {
			if !strings.HasPrefix(r.name, "Benchmark"+fam+"/") || r.metrics["ns/change"] == 0 {
				continue
			}
			bound := "—"
			if wm, ok := r.metrics["workmem-bytes"]; ok && strings.Contains(r.name, "impl=pgreorder") && !strings.Contains(r.name, "noaccounting") {
				bound = strconv.FormatFloat((wm+slack)/(1<<20), 'f', 1, 64)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", strings.TrimPrefix(r.name, "Benchmark"),
				num(r, "ns/change"), num(r, "allocs/change"), num(r, "B/change"), mib(r, "spilled-bytes"),
				mib(r, "peak-heap-bytes"), mib(r, "peak-live-bytes"), bound)
		}
	}
}

// targets prints the benchmark targets with the measured values.
func targets(w io.Writer, all []result) {
	find := func(sub ...string) (result, bool) {
	next:
		for _, r := range all {
			for _, s := range sub {
				if !strings.Contains(r.name, s) {
					continue next
				}
			}
			return r, true
		}
		return result{}, false
	}
	fmt.Fprintln(w, "| target | measured | met |")
	fmt.Fprintln(w, "|---|---|---|")
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	if r, ok := find("BulkInsert", "accounting=paired"); ok {
		v := r.metrics["overhead-%"]
		fmt.Fprintf(w, "| accounting + heap cost ≤ 3%% (%s) | %.2f%% (off %.1f, on %.1f ns/change, best of alternating runs) | %s |\n",
			short(r.name), v, r.metrics["off-ns/change"], r.metrics["on-ns/change"], yes(v <= 3))
	}
	worst, worstName, n := -math.MaxFloat64, "", 0
	worstLive, worstLiveName := -math.MaxFloat64, ""
	for _, r := range all {
		wm, ok := r.metrics["workmem-bytes"]
		if !ok || strings.Contains(r.name, "noaccounting") {
			continue
		}
		n++
		if d := r.metrics["peak-heap-bytes"] - (wm + slack); d > worst {
			worst, worstName = d, r.name
		}
		if d := r.metrics["peak-live-bytes"] - (wm + slack); d > worstLive {
			worstLive, worstLiveName = d, r.name
		}
	}
	if n > 0 {
		fmt.Fprintf(w, "| peak Go heap ≤ work mem + 16 MiB, every case (%d pgreorder cases) | heap objects: closest case %s at %+.1f MiB from the bound | %s |\n",
			n, short(worstName), worst/(1<<20), yes(worst <= 0))
		fmt.Fprintf(w, "| (same, live heap after each GC) | closest case %s at %+.1f MiB from the bound | %s |\n",
			short(worstLiveName), worstLive/(1<<20), yes(worstLive <= 0))
	}
	for _, wm := range []string{"workmem=unlimited", "workmem=64MB", "workmem=256kB", "workmem=64kB"} {
		p, ok1 := find("BulkInsert", wm, "impl=pgreorder")
		if !ok1 || strings.Contains(p.name, "noaccounting") {
			continue
		}
		rows := p.name[strings.Index(p.name, "rows="):]
		rows = rows[:strings.Index(rows, "/")]
		nv, ok2 := find("BulkInsert", rows+"/", "impl=naive")
		if !ok2 {
			continue
		}
		speedup := nv.metrics["ns/change"] / p.metrics["ns/change"]
		mem := p.metrics["peak-heap-bytes"] / nv.metrics["peak-heap-bytes"]
		live := p.metrics["peak-live-bytes"] / nv.metrics["peak-live-bytes"]
		fmt.Fprintf(w, "| bulk insert ≥ 3× naive throughput (%s, %s) | %.2f× | %s |\n", rows, wm, speedup, yes(speedup >= 3))
		fmt.Fprintf(w, "| bulk insert ≤ ¼ naive peak memory (%s, %s) | heap objects %.2f, live heap %.2f | %s |\n", rows, wm, mem, live, yes(mem <= 0.25))
	}
	for _, r := range all {
		v, ok := r.metrics["pgreorder-vs-readonly-on-%"]
		if !ok {
			continue
		}
		fmt.Fprintf(w, "| live %s: pgreorder COMMIT→last within 5%% of read-only (streaming on) | %+.1f%% (%.0f vs %.0f ms; streaming off %.0f ms, %.2f× slower than on) | %s |\n",
			short(r.name), v, r.metrics["pgreorder-on-commit-to-last-ms"], r.metrics["readonly-on-commit-to-last-ms"],
			r.metrics["readonly-off-commit-to-last-ms"], r.metrics["readonly-off/on-x"], yes(v <= 5))
		sp := r.metrics["pgreorder-on-spill-bytes"]
		fmt.Fprintf(w, "| live %s: publisher spill 0 B with streaming on | %.0f B (streaming off: %s B; streamed %s B) | %s |\n",
			short(r.name), sp, human(r.metrics["readonly-off-spill-bytes"]), human(r.metrics["pgreorder-on-stream-bytes"]), yes(sp == 0))
		fmt.Fprintf(w, "| live %s: client CPU | pgreorder %.0f ms, read-only on %.0f ms, read-only off %.0f ms | — |\n",
			short(r.name), r.metrics["pgreorder-on-cpu-ms"], r.metrics["readonly-on-cpu-ms"], r.metrics["readonly-off-cpu-ms"])
	}
}

func short(name string) string { return strings.TrimPrefix(name, "Benchmark") }

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "charts:", err)
	os.Exit(1)
}
