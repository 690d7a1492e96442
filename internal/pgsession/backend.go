package pgsession

import (
	"fmt"
	"strconv"
)

// Backend describes a server process, as pg_stat_activity shows it: who holds a slot or a lock.
// Fields the server did not show (a role without pg_read_all_stats sees only its own sessions'
// client details) are empty.
type Backend struct {
	PID             int
	ApplicationName string
	User            string
	ClientAddr      string // the client's IP address; "" for a Unix socket
	ClientHostname  string // with log_hostname
	BackendStart    string // when it connected, as the server prints timestamps
	State           string // active, idle, idle in transaction, ...
}

func (b Backend) String() string {
	s := fmt.Sprintf("pid %d", b.PID)
	if b.ApplicationName != "" {
		s += fmt.Sprintf(", application_name %q", b.ApplicationName)
	}
	if b.User != "" {
		s += ", user " + b.User
	}
	switch {
	case b.ClientAddr != "" && b.ClientHostname != "":
		s += ", client " + b.ClientAddr + " (" + b.ClientHostname + ")"
	case b.ClientAddr != "":
		s += ", client " + b.ClientAddr
	case b.PID != 0 && b.BackendStart != "":
		s += ", local client"
	}
	if b.BackendStart != "" {
		s += ", connected " + b.BackendStart
	}
	if b.State != "" {
		s += ", " + b.State
	}
	return s
}

// BackendColumns is the select list that ScanBackend reads, over pg_stat_activity as a: the pid,
// application_name, user, client address and host name, backend start and state, as text.
const BackendColumns = "a.pid::text, coalesce(a.application_name, ''), coalesce(a.usename::text, ''), " +
	"coalesce(host(a.client_addr), ''), coalesce(a.client_hostname, ''), " +
	"coalesce(date_trunc('second', a.backend_start)::text, ''), coalesce(a.state, '')"

// ScanBackend reads a row of BackendColumns.
func ScanBackend(row []string) (Backend, bool) {
	if len(row) != 7 {
		return Backend{}, false
	}
	pid, err := strconv.Atoi(row[0])
	if err != nil {
		return Backend{}, false
	}
	return Backend{PID: pid, ApplicationName: row[1], User: row[2], ClientAddr: row[3], ClientHostname: row[4],
		BackendStart: row[5], State: row[6]}, true
}
