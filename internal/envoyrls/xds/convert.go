package xds

import (
	"errors"
	"fmt"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// TypeURL is the xDS type of the resources the client subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// The YAML the reference's ConfigXdsProtoToYaml builds, field for field. It
// is written out and parsed by envoyrls.ParseDomain, so an xDS resource is
// refused for exactly what the same file would be refused for, and the
// stored domain carries YAML that `tokenctl envoy get` can show.
type yamlRoot struct {
	Domain      string           `yaml:"domain"`
	Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
}

type yamlDescriptor struct {
	Key            string           `yaml:"key"`
	Value          string           `yaml:"value,omitempty"`
	RateLimit      *yamlRateLimit   `yaml:"rate_limit,omitempty"`
	Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
	ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
	DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
}

type yamlRateLimit struct {
	// Unit is the enum's name, as the reference's Unit.String(): UNKNOWN and
	// out-of-range values are refused by the parser unless unlimited, and
	// omitted when UNKNOWN and unlimited.
	Unit            string         `yaml:"unit,omitempty"`
	RequestsPerUnit uint32         `yaml:"requests_per_unit"`
	Unlimited       bool           `yaml:"unlimited,omitempty"`
	Name            string         `yaml:"name,omitempty"`
	Replaces        []yamlReplaces `yaml:"replaces,omitempty"`
}

type yamlReplaces struct {
	Name string `yaml:"name"`
}

// YAML renders one RateLimitConfig as the envoyproxy/ratelimit YAML file it
// stands for, converting as the reference does: descriptors with key,
// value, rate_limit {unit, requests_per_unit, unlimited, name, replaces},
// shadow_mode and detailed_metric, nested.
func YAML(rc *rlsconf.RateLimitConfig) ([]byte, error) {
	b, err := yaml.Marshal(yamlRoot{Domain: rc.GetDomain(), Descriptors: descriptors(rc.GetDescriptors())})
	if err != nil {
		return nil, fmt.Errorf("render RateLimitConfig %q as YAML: %w", rc.GetName(), err)
	}
	return b, nil
}

func descriptors(pb []*rlsconf.RateLimitDescriptor) []yamlDescriptor {
	if len(pb) == 0 {
		return nil
	}
	out := make([]yamlDescriptor, len(pb))
	for i, d := range pb {
		out[i] = yamlDescriptor{
			Key:            d.GetKey(),
			Value:          d.GetValue(),
			RateLimit:      rateLimit(d.GetRateLimit()),
			Descriptors:    descriptors(d.GetDescriptors()),
			ShadowMode:     d.GetShadowMode(),
			DetailedMetric: d.GetDetailedMetric(),
		}
	}
	return out
}

func rateLimit(pb *rlsconf.RateLimitPolicy) *yamlRateLimit {
	if pb == nil {
		return nil
	}
	rl := &yamlRateLimit{
		Unit:            pb.GetUnit().String(),
		RequestsPerUnit: pb.GetRequestsPerUnit(),
		Unlimited:       pb.GetUnlimited(),
		Name:            pb.GetName(),
	}
	if rl.Unlimited && pb.GetUnit() == rlsconf.RateLimitUnit_UNKNOWN {
		rl.Unit = ""
	}
	for _, r := range pb.GetReplaces() {
		rl.Replaces = append(rl.Replaces, yamlReplaces{Name: r.GetName()})
	}
	return rl
}

// Domain converts one RateLimitConfig into a parsed domain. file names it
// in errors (a *envoyrls.ConfigError without a line) and becomes its
// Meta.Source unless meta has one.
func Domain(file string, rc *rlsconf.RateLimitConfig, meta envoyrls.Meta) (*envoyrls.Domain, error) {
	b, err := YAML(rc)
	if err != nil {
		return nil, err
	}
	d, err := envoyrls.ParseDomain(file, b, meta)
	var ce *envoyrls.ConfigError
	if errors.As(err, &ce) {
		// It names file: context enough. Its line is one of YAML's output,
		// which the server's operator never sees, so it is dropped.
		c := *ce
		c.Line = 0
		return nil, &c
	}
	return d, err
}

// Convert turns one state-of-the-world set of resources into a Config, the
// way the reference loads a set: every resource must decode as a
// RateLimitConfig and parse, and no domain may appear twice. Each domain's
// Meta has Author author and Source "xds:" plus the resource name. Every bad
// resource is reported (errors.Join, in the order received).
func Convert(resources []*anypb.Any, author string) (*envoyrls.Config, error) {
	var errs []error
	ds := make([]*envoyrls.Domain, 0, len(resources))
	for i, res := range resources {
		rc := &rlsconf.RateLimitConfig{}
		if res.GetTypeUrl() != TypeURL {
			errs = append(errs, fmt.Errorf("resource %d: type %q, want %q", i, res.GetTypeUrl(), TypeURL))
			continue
		}
		if err := anypb.UnmarshalTo(res, rc, proto.UnmarshalOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("resource %d: decode RateLimitConfig: %w", i, err))
			continue
		}
		file := fmt.Sprintf("RateLimitConfig %q", rc.GetName())
		d, err := Domain(file, rc, envoyrls.Meta{Author: author, Source: "xds:" + rc.GetName()})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ds = append(ds, d)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cfg, err := envoyrls.NewConfig(ds...)
	if err != nil {
		return nil, fmt.Errorf("RateLimitConfig set: %w", err)
	}
	return cfg, nil
}
