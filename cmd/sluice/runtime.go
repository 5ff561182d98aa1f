package main

import (
	"flag"
	"path/filepath"
	"strconv"
)

// runtimeFlags are serve's flags for Envoy's runtime layout, each the
// twin of an environment variable envoyproxy/ratelimit reads (its
// settings.go): a flag given wins over its variable.
type runtimeFlags struct {
	root, subdirectory, appDirectory string
	ignoreDotFiles, watchRoot        bool
}

// The variables, and the defaults envoyproxy/ratelimit gives them (but
// RUNTIME_ROOT's, /srv/runtime_data/current: unset, serve reads --rules).
const (
	envRuntimeRoot      = "RUNTIME_ROOT"
	envRuntimeSubdir    = "RUNTIME_SUBDIRECTORY"
	envRuntimeAppDir    = "RUNTIME_APPDIRECTORY"
	envRuntimeIgnore    = "RUNTIME_IGNOREDOTFILES"
	envRuntimeWatch     = "RUNTIME_WATCH_ROOT"
	defaultRuntimeApp   = "config"
	defaultRuntimeWatch = true
)

func addRuntimeFlags(fs *flag.FlagSet, rt *runtimeFlags) {
	fs.StringVar(&rt.root, "runtime-root", "", "Envoy's runtime layout: read the rules from `dir`/<runtime-subdirectory>/<runtime-appdirectory> (default $"+envRuntimeRoot+"; not with --rules)")
	fs.StringVar(&rt.subdirectory, "runtime-subdirectory", "", "with the runtime layout, the `directory` under the root (default $"+envRuntimeSubdir+")")
	fs.StringVar(&rt.appDirectory, "runtime-appdirectory", defaultRuntimeApp, "with the runtime layout, the `directory` of the rule files under the subdirectory (default $"+envRuntimeAppDir+", else config)")
	fs.BoolVar(&rt.ignoreDotFiles, "runtime-ignoredotfiles", false, "with the runtime layout, skip rule files whose names start with a dot (default $"+envRuntimeIgnore+", else false: read them, as envoyproxy/ratelimit)")
	fs.BoolVar(&rt.watchRoot, "runtime-watch-root", defaultRuntimeWatch, "with the runtime layout, reload when the root (a symlink) is swapped (default $"+envRuntimeWatch+", else true)")
}

// resolve sets cfg's rules directory from the flags given and the
// environment (getenv): an explicit --rules wins; else a runtime root,
// from --runtime-root or RUNTIME_ROOT, makes the directory
// root/subdirectory/appdirectory; else --rules' default stays.
func (rt *runtimeFlags) resolve(cfg *serveConfig, given map[string]bool, getenv func(string) string) error {
	str := func(flagName string, v *string, env string) {
		if !given[flagName] {
			if e := getenv(env); e != "" {
				*v = e
			}
		}
	}
	boolean := func(flagName string, v *bool, env string) error {
		if given[flagName] {
			return nil
		}
		e := getenv(env)
		if e == "" {
			return nil
		}
		b, err := strconv.ParseBool(e)
		if err != nil {
			return usagef("serve: $%s=%q: want true or false", env, e)
		}
		*v = b
		return nil
	}
	if given["rules"] {
		if given["runtime-root"] {
			return usagef("serve: give --rules DIR or --runtime-root DIR, not both")
		}
		if getenv(envRuntimeRoot) != "" {
			cfg.rulesNote = "--rules given: $" + envRuntimeRoot + " and the other RUNTIME_* variables are not used"
		}
		return nil
	}
	str("runtime-root", &rt.root, envRuntimeRoot)
	if rt.root == "" {
		return nil
	}
	str("runtime-subdirectory", &rt.subdirectory, envRuntimeSubdir)
	str("runtime-appdirectory", &rt.appDirectory, envRuntimeAppDir)
	if err := boolean("runtime-ignoredotfiles", &rt.ignoreDotFiles, envRuntimeIgnore); err != nil {
		return err
	}
	if err := boolean("runtime-watch-root", &rt.watchRoot, envRuntimeWatch); err != nil {
		return err
	}
	cfg.rulesDir = filepath.Join(rt.root, rt.subdirectory, rt.appDirectory)
	cfg.rulesDotFiles = !rt.ignoreDotFiles
	if rt.watchRoot {
		cfg.rulesRoot = rt.root
	}
	cfg.rulesNote = "rules from Envoy's runtime layout"
	return nil
}
