package intercept

// A container's network_policy as requests and the Containers API give it.

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/ciproxy/ciproxy/internal/apierror"
	"github.com/ciproxy/ciproxy/internal/egress"
	"github.com/ciproxy/ciproxy/internal/sandbox"
)

// maxSecretValue is the longest domain secret value OpenAI accepts.
const maxSecretValue = 10 << 20

// ParseNetworkPolicy is the one reading of a container's network_policy, on the Containers API
// and on the tools' auto containers: nil when the request sets none (the sandbox tool's default
// applies), an empty Policy for {"type":"disabled"}, and the allowlist as asked otherwise
// (containers.Manager narrows it to the operator's bound). Each wrong value is OpenAI's 400 at
// its param; no secret's value is ever put in a message.
func ParseNetworkPolicy(np gjson.Result, param string) (*egress.Policy, *apierror.Error) {
	if !np.Exists() || np.Type == gjson.Null {
		return nil, nil
	}
	if !np.IsObject() {
		return nil, apierror.InvalidType(param, "an object", np)
	}
	switch t := np.Get("type"); {
	case !t.Exists():
		return nil, apierror.BadRequest("Missing required parameter: '"+param+".type'.", param+".type", apierror.CodeMissingRequiredParameter)
	case t.Type == gjson.String && t.Str == "disabled":
		if bad := unknownKeys(np, param, "type"); bad != nil {
			return nil, bad
		}
		return &egress.Policy{}, nil
	case t.Type != gjson.String || t.Str != "allowlist":
		return nil, apierror.BadRequest(fmt.Sprintf("Invalid value for '%s.type': %s. Supported values are: 'disabled' and 'allowlist'.", param, t.Raw), param+".type", apierror.CodeInvalidValue)
	}
	if bad := unknownKeys(np, param, "type", "allowed_domains", "domain_secrets"); bad != nil {
		return nil, bad
	}
	p := &egress.Policy{}
	domains, bad := nonEmptyArray(np.Get("allowed_domains"), param+".allowed_domains", true)
	if bad != nil {
		return nil, bad
	}
	for i, d := range domains {
		at := fmt.Sprintf("%s.allowed_domains[%d]", param, i)
		if bad := nonEmptyString(d, at, 0); bad != nil {
			return nil, bad
		}
		if err := egress.CheckPattern(d.Str); err != nil {
			return nil, apierror.BadRequest(fmt.Sprintf("Invalid value for '%s': %v. A domain is a host name such as 'pypi.org', or '*.example.com' for every name below example.com.", at, err), at, apierror.CodeInvalidValue)
		}
		p.Domains = append(p.Domains, d.Str)
	}
	secrets, bad := nonEmptyArray(np.Get("domain_secrets"), param+".domain_secrets", false)
	if bad != nil {
		return nil, bad
	}
	for i, s := range secrets {
		at := fmt.Sprintf("%s.domain_secrets[%d]", param, i)
		if !s.IsObject() {
			return nil, apierror.InvalidType(at, "an object", s)
		}
		if bad := unknownKeys(s, at, "domain", "name", "value"); bad != nil {
			return nil, bad
		}
		for _, k := range []string{"domain", "name", "value"} {
			limit := 0
			if k == "value" {
				limit = maxSecretValue
			}
			if bad := nonEmptyString(s.Get(k), at+"."+k, limit); bad != nil {
				return nil, bad
			}
		}
		if err := egress.CheckSecretName(s.Get("name").Str); err != nil {
			return nil, apierror.BadRequest(fmt.Sprintf("Invalid value for '%s.name': %v; the code writes it as $NAME.", at, err), at+".name", apierror.CodeInvalidValue)
		}
		p.Secrets = append(p.Secrets, egress.Secret{Domain: s.Get("domain").Str, Name: s.Get("name").Str, Value: s.Get("value").Str})
	}
	return p, nil
}

// NetworkRefusal is the client's 400 for a network policy the sandbox tool cannot give (a
// *sandbox.NetworkError in err), param naming the request's network_policy; nil for any other err.
func NetworkRefusal(err error, param string) *apierror.Error {
	var ne *sandbox.NetworkError
	if !errors.As(err, &ne) {
		return nil
	}
	if ne.Field != "" {
		param += "." + ne.Field
	}
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Param: param,
		Code: apierror.CodeUnsupportedValue, Message: "Invalid '" + param + "': " + ne.Msg + ".", Err: err}
}

// withoutSecrets is the tools as the response echoes them: every network_policy without its
// domain_secrets, as OpenAI never echoes a secret (the container object shows only type and
// allowed_domains), so that none reaches the client, the store or a log.
func withoutSecrets(tools []byte) []byte {
	var paths []string
	gjson.ParseBytes(tools).ForEach(func(k, t gjson.Result) bool {
		for _, at := range []string{"container.network_policy.domain_secrets", "environment.network_policy.domain_secrets"} {
			if t.Get(at).Exists() {
				paths = append(paths, k.String()+"."+at)
			}
		}
		return true
	})
	for _, p := range paths {
		if out, err := sjson.DeleteBytes(tools, p); err == nil {
			tools = out
		}
	}
	return tools
}

// setNetwork tells the model, in the stand-ins' descriptions, what a new container's code can
// reach under p.
func (r *parsedRequest) setNetwork(p egress.Policy) {
	r.network = networkNote(p)
	if r.network == noInternet {
		return
	}
	if r.standInIndex >= 0 {
		if out, err := sjson.SetRawBytes(r.base, "tools."+strconv.Itoa(r.standInIndex), standInToolWith(r.fn, r.network, "")); err == nil {
			r.base = out
		}
	}
	if r.shellIndex >= 0 {
		if out, err := sjson.SetRawBytes(r.base, "tools."+strconv.Itoa(r.shellIndex), shellStandIn(r.shell.fn, r.shellDescription, r.network)); err == nil {
			r.base = out
		}
	}
}
