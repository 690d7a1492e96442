package format

// Kafka Connect schemas of the events (Config.KeySchema, ValueSchema), as Debezium's
// PostgreSQL connector declares them and Kafka's JsonConverter writes them.

// sourceFields are the fields of the source block.
const sourceFields = `{"type":"string","optional":false,"field":"version"},` +
	`{"type":"string","optional":false,"field":"connector"},` +
	`{"type":"string","optional":false,"field":"name"},` +
	`{"type":"int64","optional":false,"field":"ts_ms"},` +
	`{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},"default":"false","field":"snapshot"},` +
	`{"type":"string","optional":false,"field":"db"},` +
	`{"type":"string","optional":true,"field":"sequence"},` +
	`{"type":"int64","optional":true,"field":"ts_us"},` +
	`{"type":"int64","optional":true,"field":"ts_ns"},` +
	`{"type":"string","optional":false,"field":"schema"},` +
	`{"type":"string","optional":false,"field":"table"},` +
	`{"type":"int64","optional":true,"field":"txId"},` +
	`{"type":"int64","optional":true,"field":"lsn"},` +
	`{"type":"int64","optional":true,"field":"xmin"},` +
	`{"type":"string","optional":true,"field":"origin"},` +
	`{"type":"int64","optional":true,"field":"origin_lsn"}`

// sourceSchema is the source field of an envelope.
const sourceSchema = `{"type":"struct","fields":[` + sourceFields + `],"optional":false,"name":"io.debezium.connector.postgresql.Source","version":1,"field":"source"}`

// transactionSchema is the transaction field of an envelope.
const transactionSchema = `{"type":"struct","fields":[{"type":"string","optional":false,"field":"id"},` +
	`{"type":"int64","optional":false,"field":"total_order"},{"type":"int64","optional":false,"field":"data_collection_order"}],` +
	`"optional":true,"name":"event.block","version":1,"field":"transaction"}`

// envelopeTail are the last fields of a row event's envelope.
const envelopeTail = `{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},` +
	`{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"}`

// messageSchema and messageKeySchema are the schemas of a logical decoding message's value and key.
const (
	messageSchema = `{"type":"struct","fields":[{"type":"string","optional":false,"field":"op"},` +
		`{"type":"int64","optional":true,"field":"ts_ms"},` + sourceSchema + `,` + transactionSchema + `,` +
		`{"type":"struct","fields":[{"type":"string","optional":true,"field":"prefix"},{"type":"bytes","optional":true,"field":"content"}],` +
		`"optional":false,"name":"io.debezium.connector.postgresql.Message","version":1,"field":"message"}],` +
		`"optional":false,"name":"io.debezium.connector.postgresql.MessageValue","version":1}`
	messageKeySchema = `{"type":"struct","fields":[{"type":"string","optional":true,"field":"prefix"}],` +
		`"optional":false,"name":"io.debezium.connector.postgresql.MessageKey","version":1}`
)

// appendColumnSchema appends the schema of column i of t as a struct field.
func (t *dbzTable) appendColumnSchema(b []byte, i int, optional bool) []byte {
	return t.types[i].appendSchema(b, optional, t.defs[i], t.rel.Columns[i].Name)
}

// keySchema returns the schema of t's keys.
func (w *Writer) keySchema(t *dbzTable) []byte {
	if t.keySchema != nil {
		return t.keySchema
	}
	b := []byte(`{"type":"struct","fields":[`)
	for n, i := range t.key {
		if n > 0 {
			b = append(b, ',')
		}
		b = t.appendColumnSchema(b, i, false)
	}
	b = append(b, `],"optional":false,"name":`...)
	b = appendJSONString(b, t.base+".Key")
	t.keySchema = append(b, '}')
	return t.keySchema
}

// envelope returns the schema of t's row and truncate events.
func (w *Writer) envelope(t *dbzTable) []byte {
	if t.envelope != nil {
		return t.envelope
	}
	value := func(b []byte, field string) []byte {
		b = append(b, `{"type":"struct","fields":[`...)
		for i := range t.types {
			if i > 0 {
				b = append(b, ',')
			}
			b = t.appendColumnSchema(b, i, !t.notNull[i])
		}
		b = append(b, `],"optional":true,"name":`...)
		b = appendJSONString(b, t.base+".Value")
		return append(b, `,"field":"`+field+`"}`...)
	}
	b := []byte(`{"type":"struct","fields":[`)
	b = value(b, "before")
	b = append(b, ',')
	b = value(b, "after")
	b = append(b, ","+sourceSchema+","+transactionSchema+","+envelopeTail+`],"optional":false,"name":`...)
	b = appendJSONString(b, t.base+".Envelope")
	t.envelope = append(b, `,"version":2}`...)
	return t.envelope
}
