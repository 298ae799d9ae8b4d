#!/usr/bin/env perl
# hello: a Disbatch plugin in Perl, core modules only (JSON::PP ships with Perl 5.14+).
# The task document arrives on stdin as JSON; params.name is the name to greet.
use strict;
use warnings;
use JSON::PP;

my $task = decode_json(do { local $/; <STDIN> });
my $name = $task->{params}{name};

if (!defined $name || ref $name || $name !~ /\A[A-Za-z0-9 ._-]{1,64}\z/) {
    print STDERR "hello: params.name must be 1 to 64 letters, digits, spaces, '.', '_' or '-'\n";
    exit 3;
}

print "Hello, $name!\n";
print STDERR "warning: an example greeting for task $ENV{DISBATCH_TASK_ID}\n";

# Optional: a result for the attempt record (and for chaining, when the queue has `then`).
open my $result, '>', $ENV{DISBATCH_RESULT} or die "hello: cannot write the result: $!\n";
print $result encode_json({ output => { greeted => "$name" } });
close $result or die "hello: cannot write the result: $!\n";
