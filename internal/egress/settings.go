package egress

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"gopkg.in/yaml.v3"

	"github.com/ciproxy/ciproxy/internal/settings"
)

// Bound is a sandbox tool's network settings as the operator wrote them: the most any of its
// containers may reach, and what a container created without a policy gets.
type Bound struct {
	// Policy is the operator's bound: allowed_domains, and the operator's own domain_secrets
	// (added to the containers whose policy keeps their domain).
	Policy Policy
	// Default: a container created without a network_policy gets the whole bound
	// (default_network_policy: allowlist) rather than no network (disabled, OpenAI's default).
	Default bool
}

// Keys are the litellm_params keys DecodeSettings reads, for the backends that enforce policies.
func Keys() []string { return []string{"allowed_domains", "domain_secrets", "default_network_policy"} }

// secretName is what a domain secret may be called: the code writes it as $NAME.
var secretName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckSecretName returns why name cannot name a domain secret, or nil.
func CheckSecretName(name string) error {
	if len(name) > 128 || !secretName.MatchString(name) {
		return fmt.Errorf("%q is not a secret name (letters, digits and _, not starting with a digit, at most 128)", name)
	}
	return nil
}

// DecodeSettings reads a sandbox tool's network settings from p. Each wrong value is recorded in p
// with its line and left out. A secret's value is never put in a message.
func DecodeSettings(p *settings.Map) Bound {
	var b Bound
	if domains, ok := p.StringList("allowed_domains"); ok {
		lines := itemLines(p, "allowed_domains")
		for i, d := range domains {
			if err := CheckPattern(d); err != nil {
				line := p.ValueLine("allowed_domains")
				if len(lines) == len(domains) {
					line = lines[i]
				}
				p.Errorf(line, "%s: %v", p.Key("allowed_domains"), err)
				continue
			}
			b.Policy.Domains = append(b.Policy.Domains, Canonical(d))
		}
	}
	if n := p.Node("domain_secrets"); n != nil && !settings.IsNull(n) {
		if n.Kind != yaml.SequenceNode {
			p.Errorf(n.Line, "%s: must be a list of {domain, name, value}", p.Key("domain_secrets"))
		} else {
			for i, item := range n.Content {
				path := fmt.Sprintf("%s[%d]", p.Key("domain_secrets"), i)
				m := p.Decoder().Map(item, path, "domain secret", []string{"domain", "name", "value"}, nil)
				s := Secret{Domain: Canonical(m.String("domain").S), Name: m.String("name").S, Value: m.String("value").S}
				switch {
				case CheckPattern(s.Domain) != nil:
					p.Errorf(m.Line(), "%s.domain: %v", path, CheckPattern(s.Domain))
				case !b.Policy.Allows(s.Domain) && !containsPattern(b.Policy.Domains, s.Domain):
					p.Errorf(m.Line(), "%s.domain: %q is not in allowed_domains", path, s.Domain)
				case CheckSecretName(s.Name) != nil:
					p.Errorf(m.Line(), "%s.name: %v", path, CheckSecretName(s.Name))
				case s.Value == "":
					p.Errorf(m.Line(), "%s.value: must not be empty (os.environ/NAME reads it from the environment)", path)
				default:
					b.Policy.Secrets = append(b.Policy.Secrets, s)
				}
			}
		}
	}
	if v := p.String("default_network_policy"); v.Present {
		switch v.S {
		case "disabled":
		case "allowlist":
			b.Default = true
		default:
			p.Errorf(p.ValueLine("default_network_policy"), "%s: %s is not disabled or allowlist", p.Key("default_network_policy"), v.Shown())
		}
	}
	return b
}

// itemLines returns the line of each item of the list at key that StringList returns a value for
// (a scalar that is not null, nor an os.environ/NAME whose variable is unset), in order.
func itemLines(p *settings.Map, key string) []int {
	n := p.Node(key)
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	var lines []int
	for _, item := range n.Content {
		item = settings.Deref(item)
		if settings.IsNull(item) || item.Kind != yaml.ScalarNode {
			continue
		}
		if name, isEnv := strings.CutPrefix(item.Value, settings.EnvPrefix); isEnv {
			if _, set := p.LookupEnv(name); name == "" || !set {
				continue
			}
		}
		lines = append(lines, item.Line)
	}
	return lines
}

// Settings configure the egress server of a tool whose backend runs it (the local one), as the
// operator wrote them.
type Settings struct {
	// AllowPrivate lets allowed names resolve to private, loopback and link-local addresses.
	AllowPrivate bool
	// DNSServer ("host:port") resolves the sandboxes' names instead of the host's resolver.
	DNSServer string
	// HTTPPorts and TLSPorts are the ports plain http and CONNECT may reach (80 and 443).
	HTTPPorts, TLSPorts []int
	// MaxConnections bounds a container's connections at once.
	MaxConnections int
	// MaxBytesIn and MaxBytesOut bound what a container receives and sends over its life (0: no bound).
	MaxBytesIn, MaxBytesOut int64
}

// Default egress settings, as config.example.yaml documents them.
const (
	DefaultMaxConnections = 64
	DefaultMaxBytesIn     = 1 << 30
	DefaultMaxBytesOut    = 256 << 20
)

// DefaultSettings are the settings of a tool that sets none.
func DefaultSettings() Settings {
	return Settings{HTTPPorts: []int{80}, TLSPorts: []int{443}, MaxConnections: DefaultMaxConnections,
		MaxBytesIn: DefaultMaxBytesIn, MaxBytesOut: DefaultMaxBytesOut}
}

// ServerKeys are the litellm_params keys DecodeServerSettings reads.
func ServerKeys() []string {
	return []string{"allow_private_destinations", "dns_server", "egress_http_ports", "egress_tls_ports",
		"egress_max_connections", "egress_max_bytes_in", "egress_max_bytes_out"}
}

// DecodeServerSettings reads a tool's egress server settings from p; each wrong value is recorded
// in p with its line and its default stands in.
func DecodeServerSettings(p *settings.Map) Settings {
	s := DefaultSettings()
	s.AllowPrivate = p.Bool("allow_private_destinations", false)
	if v := p.String("dns_server"); v.Present {
		if _, port, err := net.SplitHostPort(v.S); err != nil || port == "" {
			p.Errorf(p.ValueLine("dns_server"), "%s: %s is not host:port", p.Key("dns_server"), v.Shown())
		} else {
			s.DNSServer = v.S
		}
	}
	s.HTTPPorts = ports(p, "egress_http_ports", s.HTTPPorts)
	s.TLSPorts = ports(p, "egress_tls_ports", s.TLSPorts)
	s.MaxConnections = p.Int("egress_max_connections", s.MaxConnections, 1)
	s.MaxBytesIn, _ = p.Size("egress_max_bytes_in", s.MaxBytesIn)
	s.MaxBytesOut, _ = p.Size("egress_max_bytes_out", s.MaxBytesOut)
	return s
}

func ports(p *settings.Map, key string, def []int) []int {
	list, ok := p.StringList(key)
	if !ok {
		return def
	}
	var out []int
	for _, x := range list {
		n, err := strconv.Atoi(strings.TrimSpace(x))
		if err != nil || n <= 0 || n > 65535 {
			p.Errorf(p.ValueLine(key), "%s: %q is not a port", p.Key(key), x)
			continue
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return def
	}
	return out
}

// Options are the server options of s.
func (s Settings) Options(log *zap.Logger) Options {
	o := Options{AllowPrivate: s.AllowPrivate, HTTPPorts: s.HTTPPorts, TLSPorts: s.TLSPorts,
		MaxConnections: s.MaxConnections, MaxBytesIn: s.MaxBytesIn, MaxBytesOut: s.MaxBytesOut, Log: log}
	if s.DNSServer != "" {
		o.Resolver = NewResolver(s.DNSServer)
	}
	return o
}
