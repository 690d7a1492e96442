package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/pgreorder/pgreorder/catalog"
	"github.com/pgreorder/pgreorder/decoding"
	"github.com/pgreorder/pgreorder/format"
	"github.com/pgreorder/pgreorder/internal/configerr"
	"github.com/pgreorder/pgreorder/internal/retry"
)

// ErrTopicCollision: two tables would write to the same topic, or to topics Kafka takes for the
// same one. The *TopicCollisionError that wraps it names them.
var ErrTopicCollision = retry.Stop("kafkasink: topic names collide")

// TopicCollisionError reports a table whose topic is another's, or collides with another's in
// Kafka (which takes '.' and '_' for the same character in topic names, and refuses a topic
// whose name collides with an existing one's). Other is the other table, or the zero TableName
// when the other topic is not a table's (an existing topic, the offsets or message topic).
type TopicCollisionError struct {
	Table, Other      catalog.TableName
	Topic, OtherTopic string
}

// Retryable reports false: the configuration has to route the tables to distinct topics.
func (e *TopicCollisionError) Retryable() bool { return false }

func (e *TopicCollisionError) Error() string {
	other := "topic " + e.OtherTopic
	if e.Other != (catalog.TableName{}) {
		other = fmt.Sprintf("table %s (topic %s)", e.Other, e.OtherTopic)
	}
	what := "collides in Kafka with"
	if e.Topic == e.OtherTopic {
		what = "is the topic of"
	}
	return fmt.Sprintf("%v: table %s writes to topic %s, which %s %s ('.' and '_' are the same character to Kafka); "+
		"name another topic for one of them with Config.TopicMap (-kafka-topic-map %s=TOPIC)",
		ErrTopicCollision, e.Table, e.Topic, what, other, mapKey(e.Table))
}

func (e *TopicCollisionError) Unwrap() error { return ErrTopicCollision }

// mapKey writes a table as -kafka-topic-map takes it.
func mapKey(t catalog.TableName) string { return t.String() }

// collisionKey is what Kafka compares topic names by: '.' and '_' are one character.
func collisionKey(topic string) string { return strings.ReplaceAll(topic, ".", "_") }

// ValidTopicName reports a name Kafka would refuse as a topic: empty, longer than 249
// characters, "." or "..", or holding a character other than ASCII letters, digits, '.', '_'
// and '-'.
func ValidTopicName(name string) error { return validTopic(name) }

func validTopic(name string) error {
	switch {
	case name == "":
		return errors.New("empty topic name")
	case len(name) > 249:
		return fmt.Errorf("topic name of %d characters, Kafka takes at most 249", len(name))
	case name == "." || name == "..":
		return fmt.Errorf("topic name %q", name)
	}
	for i := 0; i < len(name); i++ {
		if !format.TopicChar(name[i]) {
			return fmt.Errorf("topic name %q: only ASCII letters, digits, '.', '_' and '-'", name)
		}
	}
	return nil
}

// topics maps tables to topic names and keeps the names in use free of collisions.
type topics struct {
	prefix string
	m      map[catalog.TableName]string // Config.TopicMap

	mu      sync.Mutex
	byTable map[catalog.TableName]string // tables seen or checked: their topic
	byKey   map[string]topicUse          // collisionKey of every topic in use
}

// topicUse is who uses a topic name.
type topicUse struct {
	topic string
	table catalog.TableName // zero for a topic that is not a table's
}

func newTopics(prefix string, m map[catalog.TableName]string, reserved ...string) *topics {
	t := &topics{prefix: prefix, m: m, byTable: map[catalog.TableName]string{}, byKey: map[string]topicUse{}}
	for _, r := range reserved {
		t.byKey[collisionKey(r)] = topicUse{topic: r}
	}
	return t
}

// name returns the topic of table tn: Config.TopicMap's, or Debezium's PREFIX.SCHEMA.TABLE.
func (t *topics) name(tn catalog.TableName) string {
	if topic, ok := t.m[tn]; ok {
		return topic
	}
	return format.TopicName(t.prefix, tn.Schema, tn.Name)
}

// tableOf returns the table a relation describes; a pg_catalog table comes with an empty
// namespace.
func tableOf(r *decoding.Relation) catalog.TableName {
	ns := r.Namespace
	if ns == "" {
		ns = "pg_catalog"
	}
	return catalog.TableName{Schema: ns, Name: r.Name}
}

// use returns the topic of table tn, first checking, for a table not seen before, that its
// topic is valid and collides with no other in use.
func (t *topics) use(tn catalog.TableName) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if topic, ok := t.byTable[tn]; ok {
		return topic, nil
	}
	topic := t.name(tn)
	if err := validTopic(topic); err != nil {
		return "", configerr.WithHint(ErrInvalidConfig, ": ", "table %s: %v (choose a shorter %s, or name its topic with %s)",
			tn, err, field("TopicPrefix"), configerr.Field{Config: "kafkasink", Path: "TopicMap", Value: fmt.Sprintf("{%s: TOPIC}", tn), Arg: mapKey(tn) + "=TOPIC"})
	}
	k := collisionKey(topic)
	if u, ok := t.byKey[k]; ok {
		return "", &TopicCollisionError{Table: tn, Topic: topic, Other: u.table, OtherTopic: u.topic}
	}
	t.byKey[k] = topicUse{topic: topic, table: tn}
	t.byTable[tn] = topic
	return topic, nil
}

// CheckTables checks, before a slot is made or a stream resumes, that the tables' topics are
// valid names and collide neither with each other nor with topics the brokers already hold
// under a colliding name. It is changefeed.TableChecker's.
func (s *Sink) CheckTables(ctx context.Context, tables []catalog.TableName) error {
	existing, err := s.adm.ListTopics(ctx)
	if err != nil {
		return s.wrap(fmt.Errorf("kafkasink: listing the topics: %w", err))
	}
	have := map[string]string{}
	for _, name := range existing.Names() {
		have[collisionKey(name)] = name
	}
	for _, tn := range tables {
		topic, err := s.names.use(tn)
		if err != nil {
			return err
		}
		if other, ok := have[collisionKey(topic)]; ok && other != topic {
			return &TopicCollisionError{Table: tn, Topic: topic, OtherTopic: other}
		}
	}
	return nil
}

// collisionRefused turns the brokers' refusal of a topic whose name collides with an existing
// one into a TopicCollisionError.
func collisionRefused(err error, tn catalog.TableName, topic string) error {
	if !errors.Is(err, kerr.InvalidTopicException) && !errors.Is(err, kerr.TopicAlreadyExists) {
		return err
	}
	if !strings.Contains(err.Error(), "collide") {
		return err
	}
	return fmt.Errorf("%w: %w", &TopicCollisionError{Table: tn, Topic: topic, OtherTopic: "(one the brokers hold)"}, err)
}
