package changefeed

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgreorder/pgreorder/catalog"
)

// DefaultPublicationCheck is how often a Feed lists the publications' tables while it streams
// when Config.PublicationCheck is 0.
const DefaultPublicationCheck = 10 * time.Second

// publicationListTimeout bounds one listing of the publications' tables.
const publicationListTimeout = 5 * time.Second

// watchPublications lists the publications' tables every Config.PublicationCheck while the
// stream runs, and logs the tables added to them since the last listing and those removed
// (their changes stop). The first listing is the baseline of the log. Where the Feed tracks the
// tables (tracksTables), every listing goes to follow, which copies the added tables that have
// no changes yet (or knows them from now on, with NewTablesStream); a Follower that is a
// TableWatcher takes every listing itself; otherwise (a Follower) the stream delivers the added
// tables' changes from then on, and the rows they held before are not copied. It returns the function that stops the watch and waits for it to end.
func (f *Feed) watchPublications(ctx context.Context) (stop func()) {
	every := f.cfg.PublicationCheck
	if every < 0 {
		return func() {}
	}
	if every == 0 {
		every = DefaultPublicationCheck
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		var last []catalog.TableName
		listed := false
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			// A listing waits for a lock a transaction holds on a published table (an ALTER
			// TABLE still open, or prepared): bounded, so that the catalog reader the handlers
			// share is not held for as long.
			lctx, lcancel := context.WithTimeout(ctx, min(every, publicationListTimeout))
			withOIDs, err := f.publishedOIDs(lctx)
			lcancel()
			tables := make([]catalog.TableName, len(withOIDs))
			for i, t := range withOIDs {
				tables[i] = t.TableName
			}
			if err == nil && f.tracksTables() {
				f.ts.offer(withOIDs)
			}
			if tw, ok := f.cfg.Follower.(TableWatcher); ok && err == nil {
				refs := make([]TableRef, len(withOIDs))
				for i, t := range withOIDs {
					refs[i] = TableRef{OID: t.OID, Schema: t.Schema, Name: t.Name}
				}
				tw.PublishedTables(refs)
			}
			switch {
			case err != nil:
				if ctx.Err() == nil {
					f.log.Debug("listing the publications' tables", "err", err)
				}
			case !listed:
				last, listed = tables, true
			default:
				f.publicationChanges(last, tables)
				last = tables
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// TableWatcher is implemented by a Follower that takes up the tables added to the publications
// itself (apply copies them): the Feed's watch (Config.PublicationCheck) hands it each listing of
// the publications' tables, and logs a table added at INFO instead of warning that its rows from
// before are not delivered.
type TableWatcher interface {
	// PublishedTables takes a listing of the publications' tables. It is called from the
	// watch's goroutine, while Follow runs, and must not block.
	PublishedTables(tables []TableRef)
}

// watcher reports whether the Feed's Follower is a TableWatcher.
func (f *Feed) watcher() bool {
	_, ok := f.cfg.Follower.(TableWatcher)
	return ok
}

// publicationChanges logs the tables in now and not in before (added), and the other way round
// (removed). Both lists are sorted.
func (f *Feed) publicationChanges(before, now []catalog.TableName) {
	in := func(list []catalog.TableName, t catalog.TableName) bool {
		_, ok := slices.BinarySearchFunc(list, t, func(a, b catalog.TableName) int {
			if c := strings.Compare(a.Schema, b.Schema); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		})
		return ok
	}
	pubs := strings.Join(f.cfg.Replication.Publications, ", ")
	for _, t := range now {
		switch {
		case in(before, t):
		case f.tracksTables():
			f.log.Info("table added to the publication", "table", t.String(), "publications", pubs, "slot", f.cfg.Replication.Slot,
				"new_tables", f.cfg.NewTables.String())
		case f.watcher():
			f.log.Info("table added to the publication", "table", t.String(), "publications", pubs, "slot", f.cfg.Replication.Slot)
		default:
			f.log.Warn("table added to the publication: its changes are delivered from now on, but the rows it held "+
				"before are not copied", "table", t.String(), "publications", pubs, "slot", f.cfg.Replication.Slot)
		}
	}
	for _, t := range before {
		if !in(now, t) {
			f.log.Info("table removed from the publication: its changes stop", "table", t.String(), "publications", pubs,
				"slot", f.cfg.Replication.Slot)
		}
	}
}
