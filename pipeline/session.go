// The PostgreSQL side of a session: set-up (the catalog connection, the checks and what run creates),
// the replication connection, the server's identity across sessions, and the phantom-event guard.

package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/outbox-cdc/outbox-cdc/checkpoint"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// setup opens the catalog connection and checks (and creates) what the stream needs. A slot still
// held by this process's previous session is taken back.
func (p *Pipeline) setup(ctx context.Context, c *carried) (*session, error) {
	cfg := p.cfg
	cat, err := replication.OpenCatalog(ctx, replication.TargetOf(cfg.Postgres))
	if err != nil {
		return nil, err
	}
	// A hot standby polls here while another instance streams: it learns that from the catalog,
	// without taking a WAL sender for a replication connection on every poll.
	if c.standby {
		if slot, err := cat.Slot(ctx, cfg.Postgres.Slot); err == nil && slot.Active && slot.ActivePID != c.lastPID {
			_ = cat.Close(context.Background())
			return nil, fmt.Errorf("%w: slot %q is active for pid %d", replication.ErrSlotInUse, cfg.Postgres.Slot, slot.ActivePID)
		}
	}
	conn, srv, err := p.connect(ctx, cat)
	if err != nil {
		_ = cat.Close(context.Background())
		return nil, err
	}
	s := &session{cat: cat, conn: conn, server: srv}
	if err := p.identifyAgain(srv); err != nil {
		s.close()
		return nil, err
	}
	opts := replication.SetupOptions{
		Outbox: p.outbox(), Tables: p.tables(), Slot: cfg.Postgres.Slot, Columns: p.columnRoles(),
		CreatePublication: cfg.Postgres.CreatePublication, CreateSlot: cfg.Postgres.CreateSlot, FailoverSlot: cfg.Postgres.FailoverSlot,
		SlotSeen: c.slotSeen, PublicationSeen: c.slotSeen, Server: srv, ApplicationName: conn.ParameterStatus("application_name"),
		Ignore: replication.IgnoredTables(cfg.Postgres.IgnoreTables),
	}
	res, err := cat.Setup(ctx, opts)
	if errors.Is(err, replication.ErrSlotInUse) && c.lastPID != 0 && res.Slot.ActivePID == c.lastPID {
		ended, terr := cat.TerminateSlotHolder(ctx, cfg.Postgres.Slot, c.lastPID)
		if terr != nil {
			err = errors.Join(err, terr)
		} else if ended {
			p.log.Warn("ended this process's previous replication session, which still held the slot (its connection died without the server noticing)",
				"slot", cfg.Postgres.Slot, "pid", c.lastPID)
			for i := 0; i < 50 && errors.Is(err, replication.ErrSlotInUse); i++ {
				time.Sleep(100 * time.Millisecond)
				res, err = cat.Setup(ctx, opts)
			}
		}
	}
	if err == nil {
		// What happened to the outbox between the last session and this one.
		err = res.Verified.Continues(c.verified, p.outbox(), p.tables()...)
	}
	s.res = res
	for _, w := range res.Changed {
		p.log.Warn(w)
	}
	if err != nil {
		s.close()
		return s, err
	}
	if res.CreatedPublication {
		p.log.Info("created publication", "publication", cfg.Postgres.Publication, "table", cfg.Postgres.Table)
	}
	if res.CreatedSlot {
		p.log.Info("created replication slot", "slot", cfg.Postgres.Slot)
	}
	for _, w := range res.Warnings {
		p.log.Warn(w)
	}
	return s, nil
}

// checkPhantomRisk reads, for a failover slot, whether the primary holds logical walsenders back
// until its standbys have flushed (synchronized_standby_slots): without it a failover can leave
// phantom events in Kafka. It warns when that state changes, and health and metrics report it.
func (p *Pipeline) checkPhantomRisk(ctx context.Context, cat *replication.Catalog, failoverSlot bool) error {
	risk := false
	if failoverSlot {
		pf, err := cat.PrimaryFailover(ctx)
		if err != nil {
			return err
		}
		risk = pf.FailoverSupported() && len(pf.SynchronizedStandbySlots) == 0
	}
	if was := p.obs.setPhantomRisk(risk); risk && !was {
		p.log.Warn(phantomRiskWarning, "slot", p.cfg.Postgres.Slot)
	} else if !risk && was {
		p.log.Info("synchronized_standby_slots is set now: a failover can no longer leave phantom events", "slot", p.cfg.Postgres.Slot)
	}
	return nil
}

// session is what set-up opened for one session: the catalog connection (the verifier's), the
// replication connection that will stream, the server it reached, and what set-up found.
type session struct {
	cat    *replication.Catalog
	conn   *pgconn.PgConn
	server replication.Server
	res    replication.SetupResult
}

// close closes both connections (the stream, once started, owns conn and closes it itself).
func (s *session) close() {
	if s.conn != nil {
		_ = s.conn.Close(context.Background())
	}
	_ = s.cat.Close(context.Background())
}

// connect opens the replication connection that will stream and asks who its server is. A
// connection refused for a reason set-up names (a role without REPLICATION, wal_level below logical)
// is explained over the catalog connection cat.
func (p *Pipeline) connect(ctx context.Context, cat *replication.Catalog) (*pgconn.PgConn, replication.Server, error) {
	conn, err := replication.Connect(ctx, replication.TargetOf(p.cfg.Postgres))
	if err != nil {
		return nil, replication.Server{}, cat.ExplainConnectFailure(ctx, err)
	}
	srv, err := replication.IdentifyServer(ctx, conn)
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, replication.Server{}, err
	}
	return conn, srv, nil
}

// baseType is the stream's BaseType: it asks the catalog over a connection of its own (the stream
// asks once per user-defined type of an outbox column the router reads, so rarely).
func (p *Pipeline) baseType(ctx context.Context, oid uint32) (uint32, error) {
	cat, err := replication.OpenCatalog(ctx, replication.TargetOf(p.cfg.Postgres))
	if err != nil {
		return 0, err
	}
	defer func() { _ = cat.Close(context.Background()) }()
	return cat.BaseType(ctx, oid)
}

// identifyAgain checks that the server the session streams from is of the cluster the exactly-once
// mode's slot identity names; if it is another (restored into a new cluster), the identity is
// learned anew and the session starts over, so that its Kafka transactions and checkpoints carry it.
func (p *Pipeline) identifyAgain(srv replication.Server) error {
	if p.slotID == nil || (p.slotID.SystemID == srv.SystemID && p.slotID.Database == srv.Database) {
		return nil
	}
	old := *p.slotID
	p.slotID = &checkpoint.SlotID{SystemID: srv.SystemID, Database: srv.Database, Slot: p.cfg.Postgres.Slot}
	return fmt.Errorf("the database system changed under the router (slot identity %s, now %s): starting over with the new identity", old, p.slotID)
}

// identify learns, once, what identifies the slot across processes (exactly-once mode only): the
// cluster's system identifier and the database, with the slot's name.
func (p *Pipeline) identify(ctx context.Context) error {
	if !p.cfg.Kafka.ExactlyOnce() || p.slotID != nil {
		return nil
	}
	sys, db, err := replication.Identify(ctx, replication.TargetOf(p.cfg.Postgres))
	if err != nil {
		return err
	}
	p.slotID = &checkpoint.SlotID{SystemID: sys, Database: db, Slot: p.cfg.Postgres.Slot}
	return nil
}
