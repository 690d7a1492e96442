package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgreorder/pgreorder/apply/internal/target"
	"github.com/pgreorder/pgreorder/internal/testing/pgtest"
	"github.com/pgreorder/pgreorder/replication"
)

// TestRefusedChangeNames makes the target refuse changes: values its column types cannot read
// (through INSERT, COPY and UPDATE statements, text and binary), a statement it cannot prepare,
// and a conflict resolved as an error. The error names the source transaction, its commit LSN,
// the relation and the column, and shows none of the statements the Applier generates; the
// conflict's names the resolution that gets past it.
func TestRefusedChangeNames(t *testing.T) {
	cases := []struct {
		name    string
		target  []string // besides the source's schema
		binary  bool
		remote  []string
		want    []string
		kind    error
		wantCol bool
	}{
		{name: "insert", remote: []string{`INSERT INTO e VALUES (1, 'ab', 'x')`},
			want: []string{`INSERT "public"."e"`, `column "c" (integer)`, `invalid input syntax for type integer`}, kind: ErrData},
		{name: "too_long", remote: []string{`INSERT INTO e VALUES (1, 'abcdéf', '1')`},
			want: []string{`INSERT "public"."e"`, `column "b" (character varying(3))`, `value too long`}, kind: ErrData},
		{name: "copy", remote: []string{`INSERT INTO e SELECT g, 'ab', CASE WHEN g = 3 THEN 'x' ELSE g::text END FROM generate_series(1, 6) g`},
			want: []string{`INSERT "public"."e"`, `column "c" (integer)`, `invalid input syntax for type integer`}, kind: ErrData},
		{name: "update", remote: []string{`INSERT INTO e VALUES (1, 'ab', '1')`, `UPDATE e SET c = 'y' WHERE id = 1`},
			want: []string{`UPDATE "public"."e"`, `column "c" (integer)`, `invalid input syntax for type integer`}, kind: ErrData},
		{name: "binary", binary: true, target: []string{`DROP TABLE e`, `CREATE TABLE e (id int PRIMARY KEY, b text, c int)`},
			remote: []string{`INSERT INTO e VALUES (1, 'ab', '1')`},
			want:   []string{`INSERT "public"."e"`, `column "c"`}, kind: ErrSchemaMismatch},
		{name: "prepare", target: []string{`CREATE RULE e_nothing AS ON UPDATE TO e DO INSTEAD NOTHING`},
			remote: []string{`INSERT INTO e VALUES (1, 'ab', '1')`},
			want:   []string{`INSERT "public"."e"`, `cannot be used with table that has INSERT or UPDATE rules`}},
		{name: "conflict", target: []string{`INSERT INTO e VALUES (1, 'xy', 2)`}, remote: []string{`INSERT INTO e VALUES (1, 'ab', '1')`},
			want: []string{`conflict=insert_exists`, `set Config.Conflicts.Resolutions[conflict.InsertExists] to conflict.ApplyRemote (or conflict.Skip) to get past it`},
			kind: ErrConflict},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := fullEnv(t, testMajors[len(testMajors)-1], "refused", []string{`CREATE TABLE e (id int PRIMARY KEY, b text, c text)`})
			pgtest.ExecAll(t, e.dst, `DROP TABLE e`, `CREATE TABLE e (id int PRIMARY KEY, b varchar(3), c int)`)
			if len(c.target) > 0 {
				pgtest.ExecAll(t, e.dst, c.target...)
			}
			pgtest.ExecAll(t, e.src, c.remote...)
			cfg := e.config(t, Buffered)
			cfg.Source.Binary = c.binary
			r := start(t, cfg)
			err := r.stopped(t)
			var ae *ApplyError
			if !errors.As(err, &ae) {
				t.Fatalf("Run: %v, want an *ApplyError", err)
			}
			msg := err.Error()
			t.Logf("%s", msg)
			if c.kind != nil && !errors.Is(err, c.kind) {
				t.Errorf("Run: %v, want an error wrapping %v", err, c.kind)
			}
			want := append([]string{fmt.Sprintf("source transaction %d (commit %s,", ae.Xid, ae.CommitLSN)}, c.want...)
			if ae.Xid == 0 || ae.CommitLSN == 0 {
				t.Errorf("xid %d, commit LSN %s", ae.Xid, ae.CommitLSN)
			}
			for _, w := range want {
				if !strings.Contains(msg, w) {
					t.Errorf("the error lacks %q", w)
				}
			}
			for _, no := range []string{"WITH pgr", "set_config", "INSERT INTO", "UPDATE \"public\".\"e\" SET", "$1", "preparing"} {
				if strings.Contains(msg, no) {
					t.Errorf("the error shows the generated statement (%q)", no)
				}
			}
		})
	}
}

// TestTargetKinds: every kind and statement of the target package's change errors has its
// sentinel error and Op, described alike.
func TestTargetKinds(t *testing.T) {
	for k := target.KindMissingTable; k <= target.KindConflict; k++ {
		e := kindErr(k)
		if e == nil || strings.TrimPrefix(e.Error(), "apply: ") != k.String() {
			t.Errorf("kind %d (%s): sentinel %v", int(k), k, e)
		}
		ce := &target.ChangeError{Kind: k, Op: target.OpUpdate, Relation: `"public"."t"`, Err: errors.New("cause")}
		if err := error(changeError{ce}); !errors.Is(err, e) || !errors.As(err, new(*target.ChangeError)) {
			t.Errorf("kind %s: %v is not its sentinel or has no *target.ChangeError", k, err)
		}
	}
	if kindErr(target.KindNone) != nil {
		t.Error("KindNone has a sentinel")
	}
	// Op's values and names are part of the API: an ApplyError's message and its users' switches
	// rely on them.
	for o, want := range map[Op]string{OpNone: "", OpInsert: "INSERT", OpUpdate: "UPDATE", OpDelete: "DELETE",
		OpTruncate: "TRUNCATE", OpCommit: "COMMIT", OpCopy: "COPY"} {
		if o.String() != want {
			t.Errorf("Op %d is %q, want %q", int(o), o, want)
		}
	}
	if int(OpNone) != 0 || int(OpCopy) != 6 {
		t.Errorf("OpNone is %d and OpCopy %d, want 0 and 6", int(OpNone), int(OpCopy))
	}
	if Op(target.OpCopy+1).String() != "Op(7)" {
		t.Errorf("an Op past the last: %q", Op(target.OpCopy+1))
	}
}

// TestTargetConfigErrors: a target configuration the connections cannot be made with is
// ErrInvalidConfig, from every way apply connects to the target.
func TestTargetConfigErrors(t *testing.T) {
	ctx := context.Background()
	for name, o := range map[string]*target.Options{
		"connection string": {ConnString: "host='unterminated"},
		"TargetConfig":      {ConnConfig: &pgconn.Config{}}, // not made by pgconn.ParseConfig
	} {
		_, err := connectTarget(ctx, o, "test", &target.Counters{})
		var ce *target.ConfigError
		if !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &ce) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	a := &Applier{cfg: Config{Source: replication.Config{Slot: "s"}, Target: "host='unterminated"}}
	if _, err := a.Uninstall(ctx, UninstallOptions{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Uninstall: %v, want ErrInvalidConfig", err)
	}
}
