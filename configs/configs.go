// Package configs holds the ready stack configurations, embedded so that
// programs (stackdemo above all) run with no files on disk.
package configs

import "embed"

// FS holds every *.toml file of this directory.
//
//go:embed *.toml
var FS embed.FS

// Default is the config stackdemo uses when none is given.
const Default = "udp.toml"
