package localapi

import "time"

// Ago is how long before now the Unix time unix was, to the second; a
// time in the future is "0s". The CLIs' tables of admin answers use it.
func Ago(now time.Time, unix int64) string {
	d := now.Sub(time.Unix(unix, 0)).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String()
}

// OrDash is s, or "-" for an empty cell of a CLI table.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
