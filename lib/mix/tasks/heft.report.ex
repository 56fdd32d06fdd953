defmodule Mix.Tasks.Heft.Report do
  @shortdoc "Prints Heft's memory report for this or a running node"

  @moduledoc """
  Prints `Heft.Report`: host, node, tables and warnings, in bytes.

      mix heft.report
      mix heft.report --node app@web1 --cookie secret
      mix heft.report --node app --top 2

  Without `--node` it reports on the VM Mix runs in (a one-off look at the
  host and at what loading the project costs). With `--node NAME` this VM
  becomes a hidden distributed node with a random name, connects to `NAME`
  and collects there with `:erpc`: through `Heft.Memory` when the node has
  Heft loaded, otherwise the parts plain OTP can give (Heft figures are then
  shown as unavailable). `NAME` without `@host` means this host.

  Options:

    * `--node NAME`: the node to report on.
    * `--cookie C`: its cookie (default: `~/.erlang.cookie`).
    * `--top SECONDS`: redraw every SECONDS until `q` and Enter.
    * `--width N`: columns to fit (default 80).
    * `--tables N`: table rows to show (default 15).
  """
  use Mix.Task

  @switches [node: :string, cookie: :string, top: :float, width: :integer, tables: :integer]

  @impl true
  def run(args) do
    {opts, rest, invalid} = OptionParser.parse(args, strict: @switches)

    if rest != [] or invalid != [],
      do: Mix.raise("usage: mix heft.report [--node NAME [--cookie C]] [--top S] [--width N]")

    report_opts = Keyword.take(opts, [:width, :tables])

    report_opts =
      case opts[:node] do
        nil ->
          Mix.Task.run("app.start")
          report_opts

        name ->
          case Heft.Memory.Remote.connect(name, opts[:cookie]) do
            {:ok, node} -> Keyword.put(report_opts, :node, node)
            {:error, message} -> Mix.raise(message)
          end
      end

    case opts[:top] do
      nil -> Heft.Report.print(report_opts)
      seconds -> Heft.Report.top([interval: seconds] ++ report_opts)
    end
  end
end
