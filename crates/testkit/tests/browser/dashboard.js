// Drives the dashboard of a running `tributary` HTTP door in headless chromium (playwright-core)
// for crates/testkit/tests/dashboard.rs. Usage: node dashboard.js '<json args>' with
// {url, credential, wrongCredential, screenshots, liveHub, livePartition, groupHub, newGroup,
//  ociGroup, hubCount, fleetHub, fleetGroup, fleetHosts, fleetPartitions, killMarker,
//  processorGroups, serverSideGroups, singleEventHub, singleEventGroup}. Writes the
// file killMarker when the test is to kill the fleet's second host. Prints one JSON line with what
// it measured; exits 1 on any failed check.
"use strict";
const { chromium } = require("playwright-core");
const fs = require("fs");
const path = require("path");

const args = JSON.parse(process.argv[2]);
const origin = new URL(args.url).origin;
const screenshot = (page, name) => page.screenshot({ path: path.join(args.screenshots, `${name}.png`), fullPage: false });

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`);
}

// What a reader sees beyond the numbers: both charts have a time axis (UTC clock labels, left
// to right in time order) and a value scale from 0; the header counts every consumer group the
// page has a table for and says which kinds; one thing is never "1 things".
async function checkReading(page) {
  await page.locator(".charts").scrollIntoViewIfNeeded();
  await screenshot(page, "03-charts");
  for (const chart of ["chart-rates", "chart-lag"]) {
    const axes = await page.evaluate((id) => {
      const svg = document.getElementById(id);
      const texts = (cls) =>
        Array.from(svg.querySelectorAll(`text.${cls}`), (t) => ({ text: t.textContent, x: Number(t.getAttribute("x")) }));
      return { x: texts("axis-x"), y: texts("axis-y").map((t) => t.text) };
    }, chart);
    check(axes.x.length >= 2, `${chart} has time-axis labels: ${JSON.stringify(axes.x)}`);
    check(axes.x.every((l) => /^\d\d:\d\d:\d\d$/.test(l.text)), `${chart}'s time labels are UTC clock times: ${JSON.stringify(axes.x)}`);
    const ordered = axes.x.every((l, i) => i === 0 || (l.x > axes.x[i - 1].x && l.text !== axes.x[i - 1].text));
    check(ordered, `${chart}'s time labels run left to right: ${JSON.stringify(axes.x)}`);
    check(axes.y.length >= 2 && axes.y.includes("0"), `${chart} has a value scale from 0: ${JSON.stringify(axes.y)}`);
  }
  const total = args.processorGroups + args.serverSideGroups;
  const groups = `${total} consumer groups (${args.processorGroups} processor, ${args.serverSideGroups} server-side)`;
  const overview = await page.locator("#overview").textContent();
  check(overview.includes(groups), `the header says "${groups}": ${overview}`);
  const single = page.locator(`section.hub[data-hub="${args.singleEventHub}"] h3`, { hasText: args.singleEventGroup });
  const heading = await single.textContent();
  check(/lag 1 event$/.test(heading.trim()), `one waiting event is "lag 1 event": ${heading}`);
  const text = await page.locator("body").textContent();
  const plural = text.match(/\b1 (hubs|partitions|groups|consumer groups|events|syncs)\b/);
  check(!plural, `no "1 <plural>" on the page: ${plural && plural[0]}`);
}

async function main() {
  const browser = await chromium.launch({
    executablePath: args.chromium,
    headless: true,
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  const out = { externalRequests: [] };
  try {
    const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
    // The network is off: anything not to the server itself is recorded and aborted.
    await context.route("**/*", (route) => {
      const url = route.request().url();
      if (new URL(url).origin === origin) return route.continue();
      out.externalRequests.push(url);
      return route.abort();
    });
    const page = await context.newPage();
    const shot = (name) => screenshot(page, name);

    // Unauthenticated: the page is the login form (401), the live stream and the admin API refuse.
    const anonymous = await page.goto(args.url);
    check(anonymous.status() === 401, `GET / without a session answers ${anonymous.status()}`);
    check(await page.locator("#credential").count() === 1, "the login form is shown");
    // Styled as the dashboard is: its header bar and a card around the form.
    check(await page.locator("body.login header h1").count() === 1, "the login page has the dashboard's header");
    check(await page.locator("body.login form.card").count() === 1, "the login form is a card");
    await shot("00-login");
    const events = await page.request.get(args.url + "/dashboard/events");
    check(events.status() === 401, `the event stream without a session answers ${events.status()}`);
    await page.fill("#credential", args.wrongCredential);
    await page.click("button[type=submit]");
    await page.waitForLoadState();
    const refusal = await page.locator("body").textContent();
    check(refusal.includes("not accepted"), `a wrong key is refused: ${refusal}`);
    await shot("01-login-refused");

    // Log in.
    await page.fill("#credential", args.credential);
    await Promise.all([page.waitForURL(args.url + "/"), page.click("button[type=submit]")]);
    const cookies = await context.cookies();
    const session = cookies.find((c) => c.name === "tributary_session");
    check(session && session.httpOnly && session.sameSite === "Strict", "the session cookie is HttpOnly, SameSite=Strict");

    // With the cookie but without the CSRF token the admin API refuses.
    const forged = await page.request.post(args.url + "/admin/v1/hubs", {
      data: { name: "forged", partitionCount: 1 },
    });
    check(forged.status() === 401, `an admin call without the CSRF token answers ${forged.status()}`);

    // First paint of a fresh load: the best of three (the machine is shared; all are reported).
    out.firstPaints = [];
    for (let i = 0; i < 3; i++) {
      const started = Date.now();
      await page.goto(args.url);
      out.loadMs = Date.now() - started;
      out.firstPaints.push(
        // Waits for the entry: it can be recorded just after the load event.
        await page.evaluate(
          () =>
            new Promise((resolve) => {
              new PerformanceObserver((list) => {
                const fcp = list.getEntriesByName("first-contentful-paint")[0];
                if (fcp) resolve(fcp.startTime);
              }).observe({ type: "paint", buffered: true });
            }),
        ),
      );
    }
    out.firstPaintMs = Math.min(...out.firstPaints);
    out.htmlBytes = (await page.content()).length;
    const hubs = await page.locator("section.hub").count();
    check(hubs === args.hubCount, `${hubs} hub sections shown, want ${args.hubCount}`);
    await shot("02-loaded");

    // Live: the partition that events are being sent to moves without a reload.
    await page.waitForSelector("#status.live", { timeout: 10000 });
    const cell = () =>
      page.locator(`section.hub[data-hub="${args.liveHub}"] table.partitions tbody tr`).nth(args.livePartition).locator("td").nth(2).textContent();
    const before = Number(await cell());
    await page.waitForFunction(
      ([hub, p, before]) => {
        const row = document.querySelectorAll(`section.hub[data-hub="${hub}"] table.partitions tbody tr`)[p];
        return row && Number(row.children[2].textContent) > before;
      },
      [args.liveHub, args.livePartition, before],
      { timeout: 10000 },
    );
    out.liveBefore = before;
    out.liveAfter = Number(await cell());
    const epochText = await page.locator(`section.hub[data-hub="${args.liveHub}"] table.partitions`).textContent();
    check(epochText.includes("epoch 3"), "the epoch receiver is shown");
    await page.locator(`section.hub[data-hub="${args.liveHub}"]`).scrollIntoViewIfNeeded();
    await shot("03-live");
    await checkReading(page);

    // A processor fleet: its group's table shows each host's even share; once the test kills
    // the second host, its partitions move to the first without a reload.
    await page.locator(`section.hub[data-hub="${args.fleetHub}"]`).scrollIntoViewIfNeeded();
    const ownersAre = (expected) =>
      page.waitForFunction(
        ([hub, group, expected]) => {
          const rows = document.querySelectorAll(`section.hub[data-hub="${hub}"] table.group[data-group="${group}"] tbody tr`);
          const owners = Array.from(rows, (row) => row.children[1].textContent);
          return owners.length === expected.length && owners.every((owner, i) => owner === expected[i]);
        },
        [args.fleetHub, args.fleetGroup, expected],
        { timeout: 30000 },
      );
    const [first, second] = args.fleetHosts;
    const ownedBy = (owner) => Array.from({ length: args.fleetPartitions }, () => owner);
    await page.waitForFunction(
      ([hub, group, hosts, partitions]) => {
        const rows = document.querySelectorAll(`section.hub[data-hub="${hub}"] table.group[data-group="${group}"] tbody tr`);
        const owners = Array.from(rows, (row) => row.children[1].textContent);
        return owners.length === partitions && hosts.every((h) => owners.filter((o) => o === h).length === partitions / hosts.length);
      },
      [args.fleetHub, args.fleetGroup, args.fleetHosts, args.fleetPartitions],
      { timeout: 30000 },
    );
    await shot("04-fleet");
    fs.writeFileSync(args.killMarker, second);
    const killedAt = Date.now();
    await ownersAre(ownedBy(first));
    out.fleetTakeoverMs = Date.now() - killedAt;
    await shot("05-fleet-after-kill");

    // Operator actions: create a consumer group, reset a server-side group to latest.
    await page.click(".actions summary");
    const form = page.locator('form[data-action="create-consumer-group"]');
    await form.locator('input[name="hub"]').fill(args.groupHub);
    await form.locator('input[name="name"]').fill(args.newGroup);
    await form.locator("button").click();
    await page.waitForFunction(() => document.getElementById("action-result").textContent.includes("done"), null, { timeout: 10000 });
    await page.waitForFunction(
      ([hub, group]) => document.querySelector(`section.hub[data-hub="${hub}"] .meta`).textContent.includes(group),
      [args.groupHub, args.newGroup],
      { timeout: 10000 },
    );
    const reset = page.locator('form[data-action="reset-group"]');
    await reset.locator('input[name="hub"]').fill(args.groupHub);
    await reset.locator('input[name="name"]').fill(args.ociGroup);
    await reset.locator("select").selectOption("LATEST");
    await page.evaluate(() => (document.getElementById("action-result").textContent = ""));
    await reset.locator("button").click();
    await page.waitForFunction(() => document.getElementById("action-result").textContent.includes("done"), null, { timeout: 10000 });
    // A processor group's checkpoints are not reset while one of its processors runs: the
    // refusal names the running owner.
    const processorReset = page.locator('form[data-action="reset-processor-group"]');
    await processorReset.locator('input[name="hub"]').fill(args.fleetHub);
    await processorReset.locator('input[name="name"]').fill(args.fleetGroup);
    await processorReset.locator("select").selectOption("TRIM_HORIZON");
    await page.evaluate(() => (document.getElementById("action-result").textContent = ""));
    await processorReset.locator("button").click();
    await page.waitForFunction(() => document.getElementById("action-result").textContent.includes("409"), null, { timeout: 10000 });
    out.processorResetRefusal = await page.locator("#action-result").textContent();
    check(out.processorResetRefusal.includes(first), `the refusal names the running owner: ${out.processorResetRefusal}`);
    // A compacted hub, and a hub captured to a directory, made from the operator's forms.
    const create = page.locator('form[data-action="create-hub"]');
    await create.locator('input[name="name"]').fill(args.compactedHub);
    await create.locator('select[name="cleanupPolicy"]').selectOption("Compact");
    await page.evaluate(() => (document.getElementById("action-result").textContent = ""));
    await create.locator("button").click();
    await page.waitForFunction(() => document.getElementById("action-result").textContent.includes("done"), null, { timeout: 10000 });
    const capture = page.locator('form[data-action="capture-hub"]');
    await capture.locator('input[name="hub"]').fill(args.capturedHub);
    await capture.locator('input[name="where"]').fill(args.captureDir);
    await capture.locator('select[name="encoding"]').selectOption("AvroDeflate");
    await capture.locator('input[name="interval"]').fill("120");
    await page.evaluate(() => (document.getElementById("action-result").textContent = ""));
    await capture.locator("button").click();
    await page.waitForFunction(() => document.getElementById("action-result").textContent.includes("done"), null, { timeout: 10000 });
    await page.locator(".actions").scrollIntoViewIfNeeded();
    await shot("06-action");

    // The live stream's per-tick cost, as the server reports it.
    out.tickCostMs = await page.evaluate(() => document.getElementById("status").textContent);
    await page.goto(args.url);
    await page.locator("#overview").scrollIntoViewIfNeeded();
    await shot("07-overview");
  } finally {
    await browser.close();
  }
  check(out.externalRequests.length === 0, `requests left the server: ${out.externalRequests.join(", ")}`);
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
