package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgreorder/pgreorder/internal/pgsession"
)

// DropSlot drops the slot named in Config (DROP_REPLICATION_SLOT), if it exists; the Conn can
// then create it again. While another connection holds the slot (the walsender of a consumer
// that just died, until it notices), it tries again every 100ms until ctx ends. Dropping a
// slot discards what the server kept for it: use it for a slot whose stream the consumer
// will not read, such as the slot of an initial copy that was cut short.
func (c *Conn) DropSlot(ctx context.Context) error {
	if c.sess == nil {
		return ErrClosed
	}
	if c.sess.slot == nil {
		return nil
	}
	for {
		_, err := query(ctx, c.sess.conn, "DROP_REPLICATION_SLOT "+c.cfg.Slot)
		var pgErr *pgconn.PgError
		switch {
		case err == nil, errors.As(err, &pgErr) && pgErr.Code == pgsession.UndefinedObject: // gone meanwhile
			c.sess.slot = nil
			c.log.Info("dropped slot", "slot", c.cfg.Slot)
			return nil
		case !errors.As(err, &pgErr) || pgErr.Code != pgsession.ObjectInUse: // a walsender holds it
			return fmt.Errorf("replication: DROP_REPLICATION_SLOT %s: %w", c.cfg.Slot, err)
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("replication: DROP_REPLICATION_SLOT %s: %w: %w (while waiting: %w)", c.cfg.Slot, ErrSlotActive, err, ctx.Err())
		case <-t.C:
		}
	}
}
