package main

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/internal/durable"
)

// Profiles: named sets of the global connection flags (server and TLS
// files) kept in a config file, one of them current, as `rpk profile` and
// `nats context` keep theirs. A value comes from, in order: its flag, its
// environment variable, the profile, the default. The profile is the one
// --profile or $CATENA_PROFILE names, else the current one, which is used
// only when no server is given (--server, $CATENA_SERVER): a server given
// alone is dialled with the TLS flags and variables alone, not with another
// endpoint's credentials.

// profile is one named set of connection settings.
type profile struct {
	Server  string `json:"server,omitempty"`
	TLSCA   string `json:"tlsCA,omitempty"`
	TLSCert string `json:"tlsCert,omitempty"`
	TLSKey  string `json:"tlsKey,omitempty"`
}

// profileConfig is catenactl's config file.
type profileConfig struct {
	Current  string             `json:"current,omitempty"`
	Profiles map[string]profile `json:"profiles,omitempty"`
}

// configPath is the config file: $CATENA_CONFIG, else catena/catenactl.yaml
// under the user's config directory ($XDG_CONFIG_HOME or ~/.config); ""
// when there is no such directory (no $HOME: cron, containers).
func configPath() string {
	if p := os.Getenv("CATENA_CONFIG"); p != "" {
		return p
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "catena", "catenactl.yaml")
}

// loadProfiles reads the config file; a missing file (or none possible) is
// an empty config.
func loadProfiles() (string, *profileConfig, error) {
	path := configPath()
	cfg := &profileConfig{}
	if path == "" {
		return "", cfg, nil
	}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return path, cfg, nil
	case err != nil:
		return "", nil, usageErrorf("config %s: %v", path, err)
	}
	if err := yaml.UnmarshalStrict(b, cfg); err != nil {
		return "", nil, usageErrorf("config %s does not parse: %v", path, err)
	}
	return path, cfg, nil
}

// save writes the config file atomically, readable by its owner only (it
// names key files).
func (c *profileConfig) save(path string) error {
	if path == "" {
		return usageErrorf("no config directory for profiles: set CATENA_CONFIG (or HOME)")
	}
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return durable.WriteFile(filepath.Dir(path), filepath.Base(path), b, 0o600)
}

// editProfile loads the config, has change edit the existing profile name
// (refused, exit 2, when there is none), saves it and says done.
func (a *app) editProfile(name, done string, change func(*profileConfig)) error {
	path, cfg, err := loadProfiles()
	if err != nil {
		return err
	}
	if _, ok := cfg.Profiles[name]; !ok {
		return usageErrorf("profile %q is not in %s (catenactl profile list)", name, cmp.Or(path, "any config: there is no config directory (set CATENA_CONFIG)"))
	}
	change(cfg)
	if err := cfg.save(path); err != nil {
		return failure(err)
	}
	fmt.Fprintf(a.stdout, "Profile %q %s\n", name, done)
	return nil
}

// resolveConnection fills the connection settings that neither a flag nor
// an environment variable gave from the profile, then the defaults.
func (a *app) resolveConnection(flags *pflag.FlagSet) error {
	name := a.profile
	if !flags.Changed("profile") {
		name = os.Getenv("CATENA_PROFILE")
	}
	serverGiven := flags.Changed("server") || os.Getenv("CATENA_SERVER") != ""
	var cfg *profileConfig
	path := configPath()
	if name != "" || !serverGiven {
		var err error
		if path, cfg, err = loadProfiles(); err != nil {
			return err
		}
		if name == "" {
			name = cfg.Current
		}
	}
	var p profile
	if name != "" {
		var ok bool
		if p, ok = cfg.Profiles[name]; !ok {
			return usageErrorf("profile %q is not in %s (catenactl profile list)", name, cmp.Or(path, "any config: there is no config directory (set CATENA_CONFIG)"))
		}
	}
	for _, f := range []struct {
		flag, env    string
		dst          *string
		profile, def string
	}{
		{"server", "CATENA_SERVER", &a.server, p.Server, client.DefaultAddr},
		{"tls-ca", "CATENA_TLS_CA", &a.tls.ca, p.TLSCA, ""},
		{"tls-cert", "CATENA_TLS_CERT", &a.tls.cert, p.TLSCert, ""},
		{"tls-key", "CATENA_TLS_KEY", &a.tls.key, p.TLSKey, ""},
	} {
		switch {
		case flags.Changed(f.flag):
		case os.Getenv(f.env) != "":
			*f.dst = os.Getenv(f.env)
		case f.profile != "":
			*f.dst = f.profile
		default:
			*f.dst = f.def
		}
	}
	return nil
}

func newProfileCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "profile",
		Short: "Keep named connection settings (server, TLS files) and pick the current one",
		Long: "A profile holds --server, --tls-ca, --tls-cert and --tls-key. The current profile (or --profile,\n" +
			"or $CATENA_PROFILE) fills whichever of them neither a flag nor its environment variable sets.\n" +
			"Profiles live in $CATENA_CONFIG, else catena/catenactl.yaml in the user's config directory.",
	}
	var force bool
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Save the given --server and --tls-* flags as a profile, and make it current",
		Example: "  catenactl profile create prod --server ingest.shop.example:7070 --tls-ca ca.crt --tls-cert me.crt --tls-key me.key\n" +
			"  catenactl profile create local --server 127.0.0.1:7070",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
				return usageErrorf("profile name %q: %s", name, strings.Join(errs, "; "))
			}
			flags := cmd.Flags()
			if !flags.Changed("server") {
				return usageErrorf("profile create needs --server")
			}
			if _, _, err := net.SplitHostPort(a.server); err != nil {
				return usageErrorf("--server %q is not host:port: %v", a.server, err)
			}
			p := profile{Server: a.server}
			for _, f := range []struct {
				flag string
				dst  *string
			}{{"tls-ca", &p.TLSCA}, {"tls-cert", &p.TLSCert}, {"tls-key", &p.TLSKey}} {
				if !flags.Changed(f.flag) {
					continue
				}
				v, _ := flags.GetString(f.flag)
				abs, err := filepath.Abs(v)
				if err != nil {
					return usageErrorf("--%s: %v", f.flag, err)
				}
				*f.dst = abs
			}
			// The files are checked now, not at the first command that
			// uses the profile.
			files := tlsFlags{ca: p.TLSCA, cert: p.TLSCert, key: p.TLSKey}
			if files.enabled() {
				if _, err := files.config(); err != nil {
					return err
				}
			}
			path, cfg, err := loadProfiles()
			if err != nil {
				return err
			}
			if _, ok := cfg.Profiles[name]; ok && !force {
				return usageErrorf("profile %q exists in %s (--force replaces it)", name, path)
			}
			if cfg.Profiles == nil {
				cfg.Profiles = map[string]profile{}
			}
			cfg.Profiles[name] = p
			cfg.Current = name
			if err := cfg.save(path); err != nil {
				return failure(err)
			}
			fmt.Fprintf(a.stdout, "Profile %q saved in %s and current\n", name, path)
			return nil
		},
	}
	create.Flags().BoolVar(&force, "force", false, "replace a profile of that name")

	use := &cobra.Command{
		Use:               "use NAME",
		Short:             "Make a profile the current one",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeProfiles,
		RunE: func(_ *cobra.Command, args []string) error {
			return a.editProfile(args[0], "is current", func(cfg *profileConfig) { cfg.Current = args[0] })
		},
	}

	list := &cobra.Command{
		Use:   "list",
		Short: "List the profiles; * marks the current one",
		Args:  cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			_, cfg, err := loadProfiles()
			if err != nil {
				return err
			}
			for _, n := range slices.Sorted(maps.Keys(cfg.Profiles)) {
				mark := " "
				if n == cfg.Current {
					mark = "*"
				}
				p := cfg.Profiles[n]
				tls := "plaintext"
				switch {
				case p.TLSCert != "":
					tls = "mutual TLS"
				case p.TLSCA != "":
					tls = "TLS"
				}
				fmt.Fprintf(a.stdout, "%s %s\t%s\t%s\n", mark, n, p.Server, tls)
			}
			return nil
		},
	}

	del := &cobra.Command{
		Use:               "delete NAME",
		Short:             "Delete a profile",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeProfiles,
		RunE: func(_ *cobra.Command, args []string) error {
			return a.editProfile(args[0], "deleted", func(cfg *profileConfig) {
				delete(cfg.Profiles, args[0])
				if cfg.Current == args[0] {
					cfg.Current = ""
				}
			})
		},
	}
	cmd.AddCommand(create, use, list, del)
	return cmd
}

// completeProfiles completes profile names.
func completeProfiles(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	_, cfg, err := loadProfiles()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	return slices.Sorted(maps.Keys(cfg.Profiles)), cobra.ShellCompDirectiveNoFileComp
}
