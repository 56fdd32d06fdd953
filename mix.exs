defmodule Mix.Tasks.Compile.HeftNative do
  # Builds the Rust NIF (native/heft_nif) with cargo in the release profile and
  # installs it as priv/native/libheft_nif.so, where Heft.Native loads it.
  #
  # The old library is deleted before the new one is copied in: overwriting a
  # shared object in place changes pages that a running VM has mapped and
  # crashes it; unlinking keeps the old inode alive for whoever has it mapped.
  @moduledoc false
  use Mix.Task.Compiler

  @lib "libheft_nif.so"

  @impl true
  def run(_args) do
    root = Path.dirname(Mix.Project.project_file())
    cargo = System.find_executable("cargo") || Path.expand("~/.cargo/bin/cargo")

    args = ["build", "--release", "--quiet", "-p", "heft_nif"]

    case System.cmd(cargo, args, cd: root, stderr_to_stdout: true, into: IO.stream()) do
      {_, 0} -> install(root)
      {_, status} -> Mix.raise("cargo build of heft_nif failed (exit status #{status})")
    end
  end

  defp install(root) do
    built = Path.join([root, "target", "release", @lib])
    dest = Path.join([root, "priv", "native", @lib])
    File.mkdir_p!(Path.dirname(dest))
    # _build/ENV/lib/heft/priv links to priv/ only if priv/ existed when Mix
    # built the structure; make sure it does before anything loads the NIF.
    Mix.Project.build_structure()

    if File.exists?(dest) and File.read!(dest) == File.read!(built) do
      {:noop, []}
    else
      _ = File.rm(dest)
      File.cp!(built, dest)
      {:ok, []}
    end
  end
end

defmodule Heft.MixProject do
  use Mix.Project

  def project do
    [
      app: :heft,
      version: "0.1.0",
      elixir: "~> 1.14",
      compilers: [:heft_native | Mix.compilers()],
      deps: [],
      elixirc_paths: elixirc_paths(Mix.env()),
      # Erlang modules: heft (the API for Erlang), heft_mnesia (the Mnesia
      # storage backend) and its admin process.
      erlc_paths: ["src"],
      # Mnesia is the user's to start: heft_mnesia, the bench and the tests
      # call it without making it a dependency of :heft (test_helper.exs
      # puts it on the code path where Mix >= 1.15 prunes it).
      elixirc_options: [
        no_warn_undefined: [:mnesia, :mnesia_lib, :mnesia_schema, :mnesia_backend_type]
      ],
      test_paths: ["test"],
      # Scripts the tests run, not tests (Mix >= 1.16 warns of .exs files
      # under test/ that are neither).
      test_ignore_filters: [~r{^test/(fixtures|support)/}],
      aliases: aliases(),
      docs: [main: "Heft"]
    ] ++ preferred_cli_env()
  end

  # `mix bench` runs in the :bench environment: the benchmark harness
  # (bench/lib: Heft.Bench and the bench task) is compiled there and in
  # :test only, never in :prod, where a dependent application compiles
  # Heft, nor in :dev.
  def cli, do: [preferred_envs: [bench: :bench]]

  # Elixir 1.14 reads preferred environments from project/0; 1.15 and later
  # read cli/0 and deprecate this key.
  defp preferred_cli_env do
    if Version.match?(System.version(), "< 1.15.0"),
      do: [preferred_cli_env: cli()[:preferred_envs]],
      else: []
  end

  def application do
    [extra_applications: [:logger]]
  end

  defp elixirc_paths(:test), do: ["lib", "bench/lib", "test/support"]
  defp elixirc_paths(:bench), do: ["lib", "bench/lib"]
  defp elixirc_paths(_), do: ["lib"]

  defp aliases do
    []
  end
end
