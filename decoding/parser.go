package decoding

// Parser decodes messages like Parse, but reuses what it returns for the messages that make up
// the bulk of a stream: an *Insert, *Update, *Delete, *Begin, *Commit or *StreamCommit it
// returns, and its tuples, are valid only until the next call to Parse on the same Parser, which
// overwrites them. It allocates only when a tuple is wider than every earlier one; other message
// types are decoded by the package's Parse and are not reused. The zero value is ready to use with zero Options. A Parser is not safe for
// concurrent use.
type Parser struct {
	Options Options

	ins     Insert
	upd     Update
	del     Delete
	begin   Begin
	commit  Commit
	scommit StreamCommit
	buf     [2][]Column // column buffers: 0 for new tuples, 1 for old ones
}

// Parse decodes one message; see the package function Parse for inStream and errors.
func (p *Parser) Parse(data []byte, inStream bool) (Message, error) {
	if len(data) == 0 {
		return nil, decodeErr(0, 0, ErrTruncated)
	}
	switch MessageType(data[0]) {
	case MsgInsert, MsgUpdate, MsgDelete:
	case MsgBegin, MsgCommit, MsgStreamCommit:
		return p.control(data)
	default:
		return Parse(data, inStream, p.Options)
	}
	c, err := start(data, p.Options)
	if err != nil {
		return nil, err
	}
	var xid uint32
	if inStream {
		xid = c.u32()
	}
	rel := c.u32()
	var m Message
	switch c.t {
	case MsgInsert:
		c.marker("N")
		p.ins = Insert{Xid: xid, RelationID: rel, New: p.tuple(&c, 0)}
		m = &p.ins
	case MsgUpdate:
		p.upd = Update{Xid: xid, RelationID: rel}
		if k := c.marker("KON"); k != 'N' {
			p.upd.OldKind = k
			p.upd.Old = p.tuple(&c, 1)
			c.marker("N")
		}
		p.upd.New = p.tuple(&c, 0)
		m = &p.upd
	case MsgDelete:
		p.del = Delete{Xid: xid, RelationID: rel, OldKind: c.marker("KO")}
		p.del.Old = p.tuple(&c, 1)
		m = &p.del
	}
	if err := c.end(); err != nil {
		return nil, err
	}
	return m, nil
}

// tuple decodes a tuple into column buffer i, growing it if the tuple is wider.
func (p *Parser) tuple(c *cursor, i int) Tuple {
	t := c.tupleInto(p.buf[i])
	if len(t) > len(p.buf[i]) {
		p.buf[i] = t
	}
	return t
}

// control decodes the fixed-size messages that begin and end transactions.
func (p *Parser) control(data []byte) (Message, error) {
	c, err := start(data, p.Options)
	if err != nil {
		return nil, err
	}
	var m Message
	switch c.t {
	case MsgBegin:
		p.begin = Begin{FinalLSN: c.lsn(), CommitTime: c.time(), Xid: c.u32()}
		m = &p.begin
	case MsgCommit:
		p.commit = Commit{Flags: c.u8(), CommitLSN: c.lsn(), EndLSN: c.lsn(), CommitTime: c.time()}
		m = &p.commit
	case MsgStreamCommit:
		p.scommit = StreamCommit{Xid: c.u32(), Flags: c.u8(), CommitLSN: c.lsn(), EndLSN: c.lsn(), CommitTime: c.time()}
		m = &p.scommit
	}
	if err := c.end(); err != nil {
		return nil, err
	}
	return m, nil
}
