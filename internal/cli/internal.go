package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/etjob/etjob/internal/agent"
	"github.com/etjob/etjob/internal/controller"
	"github.com/etjob/etjob/internal/localcluster"
)

// newInternalCommand holds the components the local cluster runs from the
// etjob binary itself: the controller and the process nodes.
func newInternalCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "internal", Hidden: true, Short: "Components run by `etjob cluster`"}
	for _, c := range []struct {
		name string
		run  func([]string) int
	}{
		{"controller", func(args []string) int { return controller.Main(args, Version) }},
		{"node", localcluster.NodeMain},
		{"agent", agent.Main},
	} {
		run := c.run
		cmd.AddCommand(&cobra.Command{
			Use:                c.name,
			DisableFlagParsing: true,
			RunE: func(_ *cobra.Command, args []string) error {
				if code := run(args); code != 0 {
					return fmt.Errorf("%s exited with code %d", c.name, code)
				}
				return nil
			},
		})
	}
	return cmd
}
