package config

import "github.com/ciproxy/ciproxy/internal/settings"

// Problem is one thing wrong with a configuration file: its line and a message that names the key.
type Problem = settings.Problem

// Errors is every problem found in one configuration file. Parse returns it as *Errors, with the
// problems of every section and every sandbox backend in line order.
type Errors = settings.Errors
