package decoding

// Parser decodes messages like Parse, but reuses what it returns for the messages that make up
// the bulk of a stream: an *Insert, *Update, *Delete, *Begin, *Commit or *StreamCommit it
// returns, and its tuples, are valid only until the next call to Parse on the same Parser, which
// overwrites them (keep m.Clone() to hold one longer). It allocates only when a tuple is wider
// than every earlier one; messages of the other types are new on each call, as from the package's
// Parse. The zero value is ready to use with zero Options. A Parser is not safe for concurrent
// use.
type Parser struct {
	Options Options

	msgs messages
	bufs [2][]Column // column buffers, see codec.bufs
}

// Parse decodes one message; see the package function Parse for inStream and errors.
func (p *Parser) Parse(data []byte, inStream bool) (Message, error) {
	if len(data) > 0 {
		switch MessageType(data[0]) {
		case MsgInsert, MsgUpdate, MsgDelete: // every protocol version has them
			if m, ok := p.parseRow(data, inStream); ok {
				return m, nil
			}
		}
	}
	var c codec
	if err := c.start(data, inStream, p.Options); err != nil {
		return nil, err
	}
	switch c.t {
	case MsgInsert, MsgUpdate, MsgDelete, MsgBegin, MsgCommit, MsgStreamCommit:
	default:
		return Parse(data, inStream, p.Options)
	}
	c.store = true
	c.bufs = p.bufs
	m := p.msgs.get(c.t)
	walk(&c, m)
	p.bufs = c.bufs
	if err := c.end(); err != nil {
		return nil, err
	}
	return m, nil
}
