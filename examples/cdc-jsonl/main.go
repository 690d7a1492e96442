// Command cdc-jsonl is the smallest correct pgreorder consumer: it appends each committed
// transaction of a publication to a JSON-lines file, fsyncs, and only then acknowledges it.
//
//	cdc-jsonl -dsn 'host=/tmp dbname=app' -slot cdc -publication pub -create-slot -out changes.jsonl
//
// On start it reads the file's last line to learn where it stopped (its end_lsn) and resumes
// after it: a crash at any point neither loses a transaction nor writes one twice. A partial last
// line (a crash in the middle of a write) is cut off first.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/internal/jsonl"
	"github.com/pgreorder/pgreorder/reorderbuffer"
	"github.com/pgreorder/pgreorder/replication"
)

type config struct {
	dsn, slot, out string
	publications   []string
	createSlot     bool
	log            *slog.Logger
	// afterWrite, when set, runs after a transaction is written and synced, before its Ack
	// (tests inject crashes there).
	afterWrite func(t *reorderbuffer.Txn) error
}

func main() {
	var c config
	flag.StringVar(&c.dsn, "dsn", "", "source database connection string")
	flag.StringVar(&c.slot, "slot", "", "replication slot")
	pub := flag.String("publication", "", "publication(s), comma-separated")
	flag.BoolVar(&c.createSlot, "create-slot", false, "create the slot if it does not exist")
	flag.StringVar(&c.out, "out", "changes.jsonl", "output file (appended to)")
	flag.Parse()
	if c.dsn == "" || c.slot == "" || *pub == "" {
		flag.Usage()
		os.Exit(2)
	}
	c.publications = strings.Split(*pub, ",")
	c.log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil && ctx.Err() == nil {
		c.log.Error("stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) (err error) {
	f, resume, err := openOutput(c.out)
	if err != nil {
		return err
	}
	defer f.Close()
	s, err := replication.Start(ctx, replication.Config{
		ConnString:   c.dsn,
		Slot:         c.slot,
		Publications: c.publications,
		CreateSlot:   c.createSlot,
		Messages:     true,
		Buffer:       reorderbuffer.Config{SkipThrough: resume},
		Logger:       c.log,
	})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := s.Close(context.WithoutCancel(ctx)); err == nil {
			err = cerr
		}
	}()
	w := bufio.NewWriter(f)
	enc := jsonl.NewWriter(w)
	for {
		t, err := s.Next(ctx)
		if err != nil {
			return err
		}
		// 1. write  2. fsync  3. acknowledge: never the other way round.
		if err := enc.WriteTxn(t); err != nil {
			return err
		}
		if err := w.Flush(); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		if c.afterWrite != nil {
			if err := c.afterWrite(t); err != nil {
				return err
			}
		}
		s.Ack(t)
	}
}

// openOutput opens path for appending, cuts off a partial last line, and returns the end LSN of
// the last complete line (0 if the file is empty).
func openOutput(path string) (*os.File, decoding.LSN, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, 0, err
	}
	last, end, err := lastLine(f)
	if err == nil {
		err = f.Truncate(end)
	}
	if err == nil {
		_, err = f.Seek(end, io.SeekStart)
	}
	var resume decoding.LSN
	if err == nil && last != nil {
		var v struct {
			EndLSN string `json:"end_lsn"` // a transaction
			LSN    string `json:"lsn"`     // a non-transactional message
		}
		if err = json.Unmarshal(last, &v); err == nil {
			if v.EndLSN == "" {
				v.EndLSN = v.LSN
			}
			var hi, lo uint32
			if _, err = fmt.Sscanf(v.EndLSN, "%X/%X", &hi, &lo); err == nil {
				resume = decoding.LSN(uint64(hi)<<32 | uint64(lo))
			}
		}
		if err != nil {
			err = fmt.Errorf("%s: last line: %w", path, err)
		}
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, resume, nil
}

// lastLine returns the last newline-terminated line of f and the offset just past it.
func lastLine(f *os.File) ([]byte, int64, error) {
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, 0, err
	}
	const step = 64 << 10
	var tail []byte
	for off := size; off > 0; {
		n := min(int64(step), off)
		off -= n
		chunk := make([]byte, n)
		if _, err := f.ReadAt(chunk, off); err != nil {
			return nil, 0, err
		}
		tail = append(chunk, tail...)
		// The complete part ends at the last '\n'; its last line starts after the '\n' before.
		end := bytes.LastIndexByte(tail, '\n')
		if end < 0 {
			continue
		}
		if start := bytes.LastIndexByte(tail[:end], '\n'); start >= 0 || off == 0 {
			return tail[start+1 : end], off + int64(end) + 1, nil
		}
	}
	return nil, 0, nil
}
