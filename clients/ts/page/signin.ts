// Sign-in with the site's identity provider: the authorization code flow with PKCE, as a public
// client, by oidc-client-ts (a well-kept library: discovery, state and nonce checks, PKCE, token
// refresh and sign-out; 69 KB minified, 18 KB gzipped, in a page that is loaded once: security
// code worth not writing by hand).
// The server says which provider and client (`/auth.json`); a server without one shows no
// button. Tokens stay in sessionStorage (this tab only), never in the URL.
import { UserManager, WebStorageStateStore, type User } from "oidc-client-ts";

export interface AuthConfig {
  issuer?: string;
  clientId?: string;
}

export interface SignIn {
  /** Why the sign-in the provider sent the browser back from did not complete, or "". */
  failure: string;
  /** The access token while signed in (refreshed before it expires), else undefined. */
  token(): string | undefined;
  signIn(): Promise<void>;
  signOut(): Promise<void>;
}

/** The page's address without the provider's answer (`code`, `state`...), where it returns. */
function home(): string {
  return location.origin + location.pathname;
}

const RETURN_KEY = "pvwire.signin.query"; // the page's own query, kept across the provider's pages

/**
 * Call first, before the page reads its query: when the provider just sent the browser back,
 * puts the page's own query back in the address (the provider returns to the bare page) and
 * returns the address with the provider's answer, for setUpSignIn to finish the sign-in.
 */
export function takeProviderAnswer(): string | undefined {
  const query = new URLSearchParams(location.search);
  if (!query.has("state") || !(query.has("code") || query.has("error"))) return undefined;
  const answer = location.href;
  const kept = sessionStorage.getItem(RETURN_KEY) ?? "";
  sessionStorage.removeItem(RETURN_KEY);
  history.replaceState(null, "", home() + kept);
  return answer;
}

/**
 * Sets up sign-in when the server names a provider: finishes a sign-in the provider redirected
 * back with (`answer`, from takeProviderAnswer), and calls `changed`
 * whenever the identity changes (signed in, refreshed, signed out).
 */
export async function setUpSignIn(server: string, changed: () => void, answer?: string): Promise<SignIn | undefined> {
  let config: AuthConfig = {};
  try {
    const r = await fetch(new URL("/auth.json", server));
    if (r.ok) config = (await r.json()) as AuthConfig;
  } catch {
    /* an older server: no sign-in */
  }
  if (!config.issuer || !config.clientId) return undefined;
  const manager = new UserManager({
    authority: config.issuer,
    client_id: config.clientId,
    redirect_uri: home(),
    post_logout_redirect_uri: home(),
    response_type: "code",
    scope: "openid profile",
    // Renewed with the refresh token 60 s before the access token expires.
    automaticSilentRenew: true,
    userStore: new WebStorageStateStore({ store: sessionStorage }),
    stateStore: new WebStorageStateStore({ store: sessionStorage }),
  });
  let user: User | null = null;
  let failure = "";
  try {
    user = answer !== undefined ? await manager.signinRedirectCallback(answer) : await manager.getUser();
  } catch (e) {
    failure = (e as Error).message; // e.g. the provider refused, or a stale answer: not signed in
  }
  const current = (): string | undefined => (user && !user.expired ? user.access_token : undefined);
  manager.events.addUserLoaded((u) => { user = u; changed(); });
  manager.events.addUserUnloaded(() => { user = null; changed(); });
  manager.events.addSilentRenewError(() => { user = null; void manager.removeUser(); changed(); });
  return {
    failure,
    token: current,
    async signIn() {
      sessionStorage.setItem(RETURN_KEY, location.search);
      await manager.signinRedirect();
    },
    async signOut() {
      const idToken = user?.id_token;
      user = null;
      await manager.removeUser();
      changed();
      // Ends the session at the provider too, or "Sign in" would sign in again without asking.
      await manager.signoutRedirect({ id_token_hint: idToken, post_logout_redirect_uri: home() + location.search });
    },
  };
}
