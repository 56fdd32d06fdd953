defmodule Heft.ReportTopTmuxTest do
  # Drives a real terminal: tmux runs `elixir` calling Heft.Report.top/1 in
  # an 80x30 pane, and the pane (with its scrollback) is captured while it
  # runs and after it exits. Guards against a top that scrolls copies of the
  # report into the scrollback, leaves escape garbage, or overflows 80
  # columns (the capture joins wrapped lines, so an overlong line shows).
  use ExUnit.Case, async: false

  @tmux System.find_executable("tmux")

  if @tmux == nil do
    @moduletag skip: "tmux is not installed: cannot drive a terminal for top/1"
  end

  setup do
    # A private tmux server (-L), so no one else's sessions are touched.
    socket = "heft_top_test_#{System.unique_integer([:positive])}"
    on_exit(fn -> System.cmd(@tmux, ["-L", socket, "kill-server"], stderr_to_stdout: true) end)
    %{socket: socket}
  end

  defp tmux(socket, args) do
    {out, 0} = System.cmd(@tmux, ["-L", socket | args], stderr_to_stdout: true)
    out
  end

  # Whole history plus the visible pane, wrapped lines joined.
  defp capture(socket), do: tmux(socket, ["capture-pane", "-p", "-J", "-S", "-", "-t", "top"])

  defp wait_for(socket, text, tries \\ 300) do
    out = capture(socket)

    cond do
      out =~ text -> out
      tries == 0 -> flunk("pane never showed #{inspect(text)}:\n#{out}")
      true -> Process.sleep(100) && wait_for(socket, text, tries - 1)
    end
  end

  defp count(haystack, needle), do: length(String.split(haystack, needle)) - 1

  test "top/1 redraws one report in place and leaves one behind", %{socket: socket} do
    ebin = Mix.Project.compile_path()
    code = "Heft.Report.top(interval: 0.2, iterations: 25)"

    cmd = "clear; echo BEFORE-TOP; elixir -pa #{ebin} -e '#{code}'; echo AFTER-TOP; sleep 120"

    tmux(socket, ["new-session", "-d", "-s", "top", "-x", "80", "-y", "30", cmd])

    # While it runs: one report on screen, however many redraws happened.
    running = wait_for(socket, "refreshing every 0.2 s")
    assert count(running, "Heft memory report") == 1
    refute running =~ "BEFORE-TOP"

    done = wait_for(socket, "AFTER-TOP")
    # After it exits: the shell's screen is back, with the last report once.
    assert count(done, "Heft memory report") == 1
    assert done =~ "BEFORE-TOP"
    refute done =~ "refreshing every"
    refute done =~ "[?1049"
    refute done =~ "\e"

    long = done |> String.split("\n") |> Enum.filter(&(String.length(&1) > 80))
    assert long == []
  end
end
