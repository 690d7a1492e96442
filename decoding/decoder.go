package decoding

// Decoder validates a pgoutput message stream against the protocol's state machine and decodes it.
// The zero value is ready to use, with zero Options. A Decoder is not safe for concurrent use.
type Decoder struct {
	opts    Options
	st      state
	scratch messages // Accept checks a message by decoding into these, keeping nothing
}

type state struct {
	inTxn      bool // between Begin and Commit, or Begin Prepare and Prepare
	txnPrepare bool // the open transaction started with Begin Prepare
	txnXid     uint32
	inBlock    bool // between Stream Start and Stream Stop
	blockXid   uint32
}

// NewDecoder returns a Decoder for a stream negotiated with opts.
func NewDecoder(opts Options) *Decoder { return &Decoder{opts: opts} }

// Options returns the options the Decoder was made with.
func (d *Decoder) Options() Options { return d.opts }

// InStream reports whether a stream block is open (Stream Start seen, Stream Stop not yet).
func (d *Decoder) InStream() bool { return d.st.inBlock }

// InTransaction reports whether a Begin…Commit or Begin Prepare…Prepare transaction is open.
func (d *Decoder) InTransaction() bool { return d.st.inTxn }

// Reset forgets the protocol state (open transaction or block), as after a reconnect.
func (d *Decoder) Reset() { d.st = state{} }

// Accept validates one message, its whole structure and its place in the stream, and advances the
// protocol state past it, without decoding it. It does not allocate on success and does not retain data. On error the state is
// unchanged. See the package doc for the rules and for Header's Xid.
func (d *Decoder) Accept(data []byte) (Header, error) {
	if len(data) > 0 {
		switch t := MessageType(data[0]); t {
		case MsgInsert, MsgUpdate, MsgDelete:
			// The bulk of a stream: a row change in a block or a transaction, valid, changes no
			// state, and its header is what route would find (every protocol version has it).
			// Anything else, the codec's path below reports.
			switch {
			case d.st.inBlock:
				if validRow(data, true) {
					return Header{Type: t, InStream: true, Xid: be.Uint32(data[1:]), RelationID: be.Uint32(data[5:])}, nil
				}
			case d.st.inTxn:
				if validRow(data, false) {
					return Header{Type: t, Xid: d.st.txnXid, RelationID: be.Uint32(data[1:])}, nil
				}
			}
		}
	}
	var h Header
	st := d.st
	if err := d.route(data, &h, &st); err != nil {
		return Header{}, err
	}
	var c codec
	c.b, c.off, c.t, c.inStream, c.abortMode = data, 1, h.Type, h.InStream, d.opts.AbortInfo
	walk(&c, d.scratch.get(h.Type))
	if err := c.end(); err != nil {
		return Header{}, err
	}
	d.st = st
	return h, nil
}

// route reads the header h of a message and checks it against the negotiated version and the
// protocol state st, which it advances past the message.
func (d *Decoder) route(data []byte, h *Header, st *state) error {
	if len(data) == 0 {
		return decodeErr(0, 0, ErrTruncated)
	}
	var err error
	if *h, err = ParseHeader(data, st.inBlock && MessageType(data[0]) != MsgStreamStart); err != nil {
		return err
	}
	if !d.opts.allows(h.Type) {
		return versionErr(h.Type, d.opts)
	}
	return st.advance(h)
}

// advance checks that a message with header h may come in state st and moves st past it.
func (st *state) advance(h *Header) error {
	var err error
	switch h.Type {
	case MsgInsert, MsgUpdate, MsgDelete, MsgTruncate, MsgRelation, MsgDataType, MsgOrigin, MsgLogicalMessage:
		switch {
		case h.Type == MsgLogicalMessage && !h.Transactional:
			// Not part of any transaction: accepted anywhere (see the package doc).
		case st.inBlock:
			if h.Type == MsgOrigin {
				h.Xid = st.blockXid
			}
		case st.inTxn:
			h.Xid = st.txnXid
		default:
			err = ErrChangeOutsideTransaction
		}
	case MsgBegin, MsgBeginPrepare:
		if st.inTxn || st.inBlock {
			err = ErrBeginInTransaction
			break
		}
		st.inTxn, st.txnPrepare, st.txnXid = true, h.Type == MsgBeginPrepare, h.Xid
	case MsgCommit, MsgPrepare:
		if !st.inTxn || st.txnPrepare != (h.Type == MsgPrepare) {
			err = ErrCommitOutsideTransaction
			break
		}
		if h.Type == MsgCommit {
			h.Xid = st.txnXid
		}
		st.inTxn = false
	case MsgStreamStart:
		if st.inBlock {
			err = ErrStreamStartInBlock
			break
		}
		if st.inTxn {
			err = ErrBeginInTransaction
			break
		}
		st.inBlock, st.blockXid = true, h.Xid
	case MsgStreamStop:
		if !st.inBlock {
			err = ErrStreamStopOutsideBlock
			break
		}
		h.Xid = st.blockXid
		st.inBlock = false
	case MsgStreamCommit, MsgStreamAbort, MsgStreamPrepare, MsgCommitPrepared, MsgRollbackPrepared:
		if st.inBlock {
			err = ErrFinishInBlock
		} else if st.inTxn {
			err = ErrFinishInTransaction
		}
	}
	if err != nil {
		return decodeErr(h.Type, 0, err)
	}
	return nil
}

// Decode is Accept and Parse in one: it validates and decodes one message and advances the
// protocol state. The message aliases data (see the package doc). On error the state is
// unchanged. Relation and Type messages are returned like any other: which description is in
// effect for a change depends on the transactions that sent them, which package reorderbuffer
// keeps track of (Txn.Relation).
func (d *Decoder) Decode(data []byte) (Message, error) {
	var h Header
	st := d.st
	if err := d.route(data, &h, &st); err != nil {
		return nil, err
	}
	m, err := Parse(data, h.InStream, d.opts)
	if err != nil {
		return nil, err
	}
	d.st = st
	return m, nil
}
